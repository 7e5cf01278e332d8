//! `[webhooks]`: which URLs an account may register, how deliveries to them are timed, how many
//! run at once, and when a failing endpoint is paused or disabled.

use serde::Deserialize;

use crate::AddressRanges;

/// `[webhooks]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Allow endpoints on loopback addresses (127.0.0.0/8, ::1, `localhost`), for local runs and
    /// tests. Every other address that is not globally reachable is refused regardless.
    pub allow_loopback: bool,
    /// Address ranges refused on top of those that are not globally reachable (the operator's
    /// own public ranges, say): a list in the file, or one string of ranges separated by commas
    /// or spaces in the environment. A bare address is a range of one.
    pub deny_ranges: AddressRanges,
    /// The longest one delivery may take, connection included; past it the attempt failed.
    pub timeout_ms: u64,
    /// The longest the connection of a delivery may take (name resolution, TCP, TLS): a host
    /// that does not answer fails fast instead of holding a place for the whole `timeout_ms`.
    pub connect_timeout_ms: u64,
    /// Deliveries one worker runs at once.
    pub max_deliveries: u32,
    /// Deliveries to one account's endpoints run at once, by every worker together.
    pub max_deliveries_per_account: u32,
    /// Deliveries to one endpoint run at once, by every worker together.
    pub max_deliveries_per_endpoint: u32,
    /// An endpoint whose deliveries failed this many times in a row...
    pub pause_after_failures: u32,
    /// ...over at least this long is paused: its deliveries are deferred, not attempted.
    pub pause_after_minutes: u32,
    /// The first pause; then one delivery is tried, and each failed one doubles the pause, up to
    /// `backoff_cap_ms`.
    pub pause_ms: u64,
    /// An endpoint failing this long is disabled, with the event `webhook_endpoint.disabled`.
    pub disable_after_hours: u32,
    /// First delay before a failed delivery is tried again; doubles per attempt, with jitter.
    pub backoff_base_ms: u64,
    /// The longest delay between two attempts.
    pub backoff_cap_ms: u64,
    /// A delivery still failing this long after its event was created is dead-lettered.
    pub horizon_hours: u32,
}
