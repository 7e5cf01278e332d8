//! The reaper: finished keys are kept for the retention window (a retry within it gets the stored
//! answer), then deleted in bounded batches; an unfinished key is never deleted, and one older
//! than the window is flagged for a person (`worker/src/reaper.rs` runs it).

use super::Engine;
use crate::error::IdemError;
use crate::observe::Event;
use crate::store;

impl Engine {
    /// The reaper: deletes up to `limit` keys completed longer than the engine's `retention` ago
    /// (the one its answers kept in memory end with). Unfinished keys are never deleted; those
    /// created longer than `retention` ago are flagged for a person instead.
    pub async fn reap(&self, limit: u32) -> Result<Reaped, IdemError> {
        let retention_ms = i64::try_from(self.config.retention.as_millis()).unwrap_or(i64::MAX);
        let deleted = store::reap(&self.pool, i64::from(limit), retention_ms).await?;
        let flagged = store::flag_stale(&self.pool, retention_ms).await?;
        for _ in 0..flagged {
            self.observer.event(Event::Flagged);
        }
        Ok(Reaped { deleted, flagged })
    }
}

/// What one reaper batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Completed keys deleted.
    pub deleted: u64,
    /// Unfinished keys past retention flagged for a person.
    pub flagged: u64,
}
