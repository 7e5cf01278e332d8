//! Retention: how long each table that only grows keeps its rows, and why no shorter. The worker's
//! reaper deletes what is past it, in bounded batches, table after table ([`Table::ALL`]); keys
//! have their own rule (`idempotency.retention_hours`, `idem`'s reaper). Each table's delete is
//! in the module that owns its SQL; this is the one place that says what is kept how long.
//!
//! | table | kept (`[retention]`) | counted from | never deleted while |
//! |---|---|---|---|
//! | `webhook_attempts` | `webhook_attempts_days`, 30 | the attempt | |
//! | `events` | `events_days`, 30 | the event | an attempt names it; a delivery of it is pending |
//! | `jobs` done | `done_jobs_days`, 7 | `done_at` | |
//! | `jobs` dead | `dead_jobs_days`, 90 | `dead_at` | (a person reads them) |
//! | `jobs` pending | forever | | always: it is work to do |
//! | `audit_events` | `audit_events_days`, 365 | the record | |
//! | `processor_events` | `processor_events_days`, 30 | its arrival | |
//!
//! Why each is safe:
//!
//! - **Events.** `GET /v1/events` then lists no older event, as Stripe's 30 days; a list whose
//!   cursor names a deleted event answers `404 resource_missing` naming the cursor's parameter, as
//!   for any unknown cursor (`crate::events::list`), and the poller starts again from the top.
//!   An attempt refers to its event by foreign key: attempts go first, and an event goes only once
//!   none names it (so attempts kept longer keep their events too). A delivery names its event in
//!   its payload and dedupe key, with no foreign key: an event goes only once no delivery of it
//!   is pending, and the settings make events outlive `webhooks.horizon_hours`, so that a
//!   receiver handling a retry can still fetch the event.
//! - **Jobs.** Every job is staged once, by the transaction that makes what it is for (a payment's
//!   success stages its receipt, a `requires_action` its authentication check, an event its
//!   deliveries), so the dedupe key of a deleted job is never staged again; and `receipts`' own
//!   key on the payment records one receipt whatever the jobs.
//! - **Audit records** are read by key (the inspector's page of a key): the settings keep them at
//!   least as long as keys.
//! - **Processor events** are read by the consumer (a redelivery finds its row and changes
//!   nothing), by a payment's operation while its key is driven (within
//!   `worker.processor_window_hours`, under a day) and by the phase that settles a payment
//!   waiting on its customer (until `processor.authentication_expires_after_s`). The settings
//!   keep them longer than both and than the processor's 3 days of redeliveries. An event the
//!   processor delivered again after its row went would be consumed again: its payment is long
//!   finished, so it wakes no key and settles nothing; at worst it reports once more a charge the
//!   payment does not account for, which a person had already been told of.
//!
//! **The walk.** Every table but `processor_events` is append-only with an identity column (`seq`
//! or `id`) that grows with its time. A batch reads the `batch_size` rows after a cursor in that
//! order and deletes those past retention that may go ([`Batch`]); it never reads by time, so
//! these tables need no index on it. The worker keeps the cursor between batches and passes,
//! so rows that may not go yet (a pending job, a dead one, an event with its attempts) never hold
//! up those behind them. Once a batch reads a row younger than the table's retention (the
//! shortest, for jobs), or the end of the table, the walk is over: the rows after it are younger
//! still, so the next walk starts again from the oldest, after a rest. An identity is taken when
//! a row is inserted and its time when its transaction began, so a row may be a little older than
//! those before it; it goes on a later walk. `processor_events` has the processor's ids, in no
//! order of time: it is read oldest first by its index on `received_at`.

use sqlx::PgExecutor;

use crate::{DomainError, audit, events, jobs, processor_events, webhooks};

/// How long each table keeps its rows, in days (the `[retention]` settings), and the rows one
/// statement deletes at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Events, from their writing.
    pub events_days: u32,
    /// Attempts of the delivery log.
    pub webhook_attempts_days: u32,
    /// The processor's webhooks, from their arrival.
    pub processor_events_days: u32,
    /// Audit records.
    pub audit_events_days: u32,
    /// Jobs done, from `done_at`.
    pub done_jobs_days: u32,
    /// Dead-lettered jobs, from `dead_at`.
    pub dead_jobs_days: u32,
    /// Rows per statement.
    pub batch_size: u32,
}

/// A table that retention keeps short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    /// `webhook_attempts`, the delivery log.
    WebhookAttempts,
    /// `events`.
    Events,
    /// `jobs`, finished ones.
    Jobs,
    /// `audit_events`.
    AuditEvents,
    /// `processor_events`.
    ProcessorEvents,
}

impl Table {
    /// Every table, in the order a pass deletes them: attempts before the events they name.
    pub const ALL: [Table; 5] = [
        Table::WebhookAttempts,
        Table::Events,
        Table::Jobs,
        Table::AuditEvents,
        Table::ProcessorEvents,
    ];

    /// The table's name.
    pub fn name(self) -> &'static str {
        match self {
            Table::WebhookAttempts => "webhook_attempts",
            Table::Events => "events",
            Table::Jobs => "jobs",
            Table::AuditEvents => "audit_events",
            Table::ProcessorEvents => "processor_events",
        }
    }

    /// One batch: of the `rules.batch_size` rows after `after` (in the table's identity order),
    /// deletes those past retention that may go.
    pub async fn delete_expired(
        self,
        executor: impl PgExecutor<'_>,
        rules: &Rules,
        after: i64,
    ) -> Result<Batch, DomainError> {
        let limit = rules.batch_size;
        match self {
            Table::WebhookAttempts => {
                webhooks::delete_expired_attempts(
                    executor,
                    after,
                    limit,
                    rules.webhook_attempts_days,
                )
                .await
            }
            Table::Events => {
                events::delete_expired(executor, after, limit, rules.events_days).await
            }
            Table::Jobs => {
                let days = (rules.done_jobs_days, rules.dead_jobs_days);
                jobs::delete_expired(executor, after, limit, days).await
            }
            Table::AuditEvents => {
                audit::delete_expired(executor, after, limit, rules.audit_events_days).await
            }
            Table::ProcessorEvents => {
                processor_events::delete_expired(executor, limit, rules.processor_events_days).await
            }
        }
    }
}

/// What one batch of a table's walk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Rows deleted.
    pub deleted: u64,
    /// Where the walk goes on from (the last identity read), if it goes on: the batch read a whole
    /// batch, all past retention. `None`: the walk is over (it read a younger row, or the end).
    pub next: Option<i64>,
}

impl Batch {
    /// A batch that deleted `deleted` of the `limit` rows it asked for, read up to `last`, of
    /// which `past` were older than the table's retention.
    pub(crate) fn walked(deleted: i64, last: Option<i64>, past: i64, limit: u32) -> Self {
        let whole = past >= i64::from(limit);
        Self { deleted: u64::try_from(deleted).unwrap_or(0), next: last.filter(|_| whole) }
    }
}

/// Days as SQL's `make_interval` takes them.
pub(crate) fn sql_days(days: u32) -> i32 {
    i32::try_from(days).unwrap_or(i32::MAX)
}
