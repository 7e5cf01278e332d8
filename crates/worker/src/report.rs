//! What a pass of the worker's loops did, and the counters it adds to.

use payments_domain::retention::Table;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Keys driven to a final answer.
    pub completed: u64,
    /// Keys that failed transiently again, released with back-off.
    pub released: u64,
    /// Keys another process took over while this one worked.
    pub lost: u64,
    /// Keys flagged for a person.
    pub flagged: u64,
    /// Completed keys deleted.
    pub reaped: u64,
    /// Jobs done.
    pub jobs_done: u64,
    /// Jobs that failed and will run again.
    pub jobs_retried: u64,
    /// Jobs dead-lettered.
    pub jobs_dead: u64,
    /// Events deleted past retention.
    pub events_deleted: u64,
    /// Attempts of the delivery log deleted past retention.
    pub webhook_attempts_deleted: u64,
    /// Finished jobs deleted past retention.
    pub jobs_deleted: u64,
    /// Audit records deleted past retention.
    pub audit_events_deleted: u64,
    /// The processor's events deleted past retention.
    pub processor_events_deleted: u64,
}

impl PassReport {
    /// Adds the pass to the worker's counters.
    pub(crate) fn count(&self) {
        for (name, value) in [
            ("worker_keys_completed_total", self.completed),
            ("worker_keys_released_total", self.released),
            ("worker_keys_lost_total", self.lost),
            ("worker_keys_flagged_total", self.flagged),
            ("worker_keys_reaped_total", self.reaped),
            ("worker_jobs_done_total", self.jobs_done),
            ("worker_jobs_retried_total", self.jobs_retried),
            ("worker_jobs_dead_total", self.jobs_dead),
        ] {
            metrics::counter!(name).increment(value);
        }
        for table in Table::ALL {
            let deleted = self.deleted(table);
            metrics::counter!("worker_retention_deleted_total", "table" => table.name())
                .increment(deleted);
        }
    }

    /// The count of `table`'s rows deleted past retention.
    pub fn deleted(&self, table: Table) -> u64 {
        match table {
            Table::Events => self.events_deleted,
            Table::WebhookAttempts => self.webhook_attempts_deleted,
            Table::Jobs => self.jobs_deleted,
            Table::AuditEvents => self.audit_events_deleted,
            Table::ProcessorEvents => self.processor_events_deleted,
        }
    }

    /// Counts `deleted` rows of `table` deleted past retention.
    pub(crate) fn expired(&mut self, table: Table, deleted: u64) {
        let count = match table {
            Table::Events => &mut self.events_deleted,
            Table::WebhookAttempts => &mut self.webhook_attempts_deleted,
            Table::Jobs => &mut self.jobs_deleted,
            Table::AuditEvents => &mut self.audit_events_deleted,
            Table::ProcessorEvents => &mut self.processor_events_deleted,
        };
        *count += deleted;
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Self) {
        self.completed += other.completed;
        self.released += other.released;
        self.lost += other.lost;
        self.flagged += other.flagged;
        self.reaped += other.reaped;
        self.jobs_done += other.jobs_done;
        self.jobs_retried += other.jobs_retried;
        self.jobs_dead += other.jobs_dead;
        for table in Table::ALL {
            self.expired(table, other.deleted(table));
        }
    }

    /// Whether the pass found any work.
    pub fn found_work(&self) -> bool {
        *self != Self::default()
    }
}
