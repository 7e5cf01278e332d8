//! The reaper: deletes everything past its retention, in bounded batches. First completed keys
//! past `idempotency.retention_hours` (unfinished ones are flagged for a person instead), then the
//! rows of each table that only grows past its `[retention]` setting, table after table
//! (`payments_domain::retention` says what is kept how long, and why).
//!
//! Each table is walked in the order of its identity column, a batch at a time, with the cursor
//! kept here between batches and passes: a pass reads at most `MAX_BATCHES_PER_PASS` batches of a
//! table, deleted or not, so it always ends, and rows that may not go yet never hold up the ones
//! behind them. A walk that reached rows too young to go rests before it starts again from the
//! oldest, so an idle reaper reads a batch per table a minute, not a second.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use payments_domain::retention::{Rules, Table};
use payments_settings::RetentionSettings;
use provider::CardProcessor;
use tokio::sync::watch;

use crate::{MAX_BATCHES_PER_PASS, PassReport, Worker};

/// How long a table's walk rests once it is over: retention is counted in days, so a minute more
/// costs nothing, and the rows that may not go yet (dead jobs, say) are read once a minute.
const WALK_REST: Duration = Duration::from_secs(60);

/// The rules, and where each table's walk stands.
#[derive(Debug)]
pub(crate) struct Walks {
    rules: Rules,
    walks: Mutex<HashMap<Table, Walk>>,
}

/// Where one table's walk stands.
#[derive(Debug, Clone, Copy)]
struct Walk {
    /// The last identity read: the next batch reads after it.
    after: i64,
    /// The walk is over and starts again from the oldest at this time.
    rests_until: Option<Instant>,
}

impl Default for Walk {
    /// Before the oldest row: below every identity, whatever the sequence starts at.
    fn default() -> Self {
        Self { after: i64::MIN, rests_until: None }
    }
}

impl Walks {
    /// Every walk at the oldest row, under the `[retention]` settings.
    pub(crate) fn new(settings: &RetentionSettings) -> Self {
        let rules = Rules {
            events_days: settings.events_days,
            webhook_attempts_days: settings.webhook_attempts_days,
            processor_events_days: settings.processor_events_days,
            audit_events_days: settings.audit_events_days,
            done_jobs_days: settings.done_jobs_days,
            dead_jobs_days: settings.dead_jobs_days,
            batch_size: settings.batch_size,
        };
        Self { rules, walks: Mutex::default() }
    }

    /// Where `table`'s next batch starts; `None` while its walk rests.
    fn next(&self, table: Table) -> Option<i64> {
        let mut walks = self.walks.lock().unwrap_or_else(PoisonError::into_inner);
        let walk = walks.entry(table).or_default();
        match walk.rests_until {
            Some(until) if Instant::now() < until => None,
            _ => {
                walk.rests_until = None;
                Some(walk.after)
            }
        }
    }

    /// Moves `table`'s walk on to `next`, or ends it (`None`): it rests, then starts again.
    fn moved(&self, table: Table, next: Option<i64>) {
        let mut walks = self.walks.lock().unwrap_or_else(PoisonError::into_inner);
        walks.insert(
            table,
            match next {
                Some(after) => Walk { after, rests_until: None },
                None => Walk { rests_until: Some(Instant::now() + WALK_REST), ..Walk::default() },
            },
        );
    }
}

impl<P: CardProcessor> Worker<P> {
    /// The reaper: keys past retention, then each table's rows past retention.
    pub async fn reap(
        &self,
        stop: &watch::Receiver<bool>,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        for _ in 0..MAX_BATCHES_PER_PASS {
            if *stop.borrow() {
                return Ok(());
            }
            let reaped = self.engine.reap(self.settings.batch_size).await?;
            report.reaped += reaped.deleted;
            report.flagged += reaped.flagged;
            if reaped.deleted < u64::from(self.settings.batch_size) {
                break;
            }
        }
        // A table whose batch fails (a lock timeout, a deadlock with another worker's walk) does
        // not hold up the tables after it: each is tried, and the first error ends the pass after
        // them, for the loop to log and try again.
        let mut failed = None;
        for table in Table::ALL {
            if let Err(error) = self.expire(table, stop, report).await {
                tracing::warn!(table = table.name(), error = %error, "retention batch failed");
                failed.get_or_insert(error);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Up to `MAX_BATCHES_PER_PASS` batches of `table`'s walk, stopping between them when asked.
    async fn expire(
        &self,
        table: Table,
        stop: &watch::Receiver<bool>,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        for _ in 0..MAX_BATCHES_PER_PASS {
            if *stop.borrow() {
                break;
            }
            let Some(after) = self.walks.next(table) else { break };
            let batch = table.delete_expired(&self.ctx.pool, &self.walks.rules, after).await?;
            report.expired(table, batch.deleted);
            self.walks.moved(table, batch.next);
            if batch.next.is_none() {
                break;
            }
        }
        Ok(())
    }
}
