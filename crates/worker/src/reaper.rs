//! The reaper: deletes completed keys past the retention window, in bounded batches, and flags
//! unfinished ones for a person instead of deleting them.

use provider::CardProcessor;
use tokio::sync::watch;

use crate::{MAX_BATCHES_PER_PASS, PassReport, Worker};

impl<P: CardProcessor> Worker<P> {
    /// The reaper.
    pub async fn reap(
        &self,
        stop: &watch::Receiver<bool>,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        for _ in 0..MAX_BATCHES_PER_PASS {
            if *stop.borrow() {
                break;
            }
            let reaped = self.engine.reap(self.settings.batch_size).await?;
            report.reaped += reaped.deleted;
            report.flagged += reaped.flagged;
            if reaped.deleted < u64::from(self.settings.batch_size) {
                break;
            }
        }
        Ok(())
    }
}
