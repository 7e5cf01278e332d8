//! `[worker]`: the background worker's passes, when an unfinished key waits for a person, its
//! jobs' retries, and how receipts are sent.

use secrecy::SecretString;
use serde::Deserialize;

/// `[worker]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Pause between passes when a pass found nothing to do.
    pub interval_ms: u64,
    /// Most keys, old keys or jobs taken in one batch.
    pub batch_size: u32,
    /// After this many runs of the completer's own (`completer_attempts`; a client's retries do
    /// not count) an unfinished key waits for a person.
    pub max_attempts: u32,
    /// An unfinished key older than this waits for a person: the processor forgets its own
    /// idempotency keys after 24 hours, and a retry after that could charge twice.
    pub processor_window_hours: u32,
    /// After this many attempts a receipt job is dead-lettered (a webhook delivery gives up at
    /// `webhooks.horizon_hours`; an authentication job never: it waits on its customer).
    pub job_max_attempts: u32,
    /// First delay before a failed job runs again; doubles per attempt.
    pub job_backoff_base_ms: u64,
    /// SMTP server for receipts, `smtp://host:port` or `smtps://…`; empty records receipts in
    /// the database and the log instead.
    pub smtp_url: SecretString,
    /// The sender of receipts.
    pub receipt_from: String,
    /// Receipts one account may have let through to be sent in any hour (the last 60 minutes);
    /// beyond it a receipt is recorded and withheld for good, not retried.
    pub receipts_per_account_per_hour: u32,
    /// The worker's own `/metrics` port on 127.0.0.1; 0 turns it off.
    pub metrics_port: u16,
}
