//! The completer: drives unfinished keys whose lease is free or expired and whose next attempt is
//! due to their end, through the very operations the API runs.

use std::time::Duration;

use idem::{Due, Interrupted};
use payments_domain::operations;
use provider::CardProcessor;
use tokio::sync::watch;

use crate::{MAX_BATCHES_PER_PASS, PassReport, Worker};

impl<P: CardProcessor> Worker<P> {
    /// The completer. It leases one key at a time, when its turn comes: a key waiting behind
    /// others in a batch would see its lease run out while slow processor calls went on ahead of
    /// it, be taken over by another worker or a retry, and then be driven a second time by this
    /// one. Each statement takes one key (`SKIP LOCKED`, so several workers never take the same
    /// one) and records the attempt; the key is driven to its end before the next is taken.
    pub async fn complete(
        &self,
        stop: &watch::Receiver<bool>,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        let window = Duration::from_secs(u64::from(self.settings.processor_window_hours) * 3600);
        let most = MAX_BATCHES_PER_PASS.saturating_mul(self.settings.batch_size as usize);
        // The operations this release resumes: a key of one it does not know (a newer release's,
        // during a rolling deploy) waits for a worker that does.
        let operations = operations::resumable();
        for _ in 0..most {
            if *stop.borrow() {
                break;
            }
            let mut due =
                self.engine.take_due(1, self.settings.max_attempts, window, &operations).await?;
            let Some(item) = due.pop() else { break };
            match item {
                Due::Flagged { .. } => report.flagged += 1,
                Due::Lease(lease) => {
                    let key_id = lease.key_id();
                    let span =
                        tracing::info_span!("completer", key_id, operation = lease.operation());
                    let outcome =
                        tracing::Instrument::instrument(operations::resume(&self.ctx, lease), span)
                            .await;
                    match outcome {
                        Ok(answer) => {
                            tracing::info!(
                                key_id,
                                status = answer.status,
                                "completer finished a key"
                            );
                            report.completed += 1;
                        }
                        // The completer drives stored keys only: never superseded.
                        Err(Interrupted::LeaseLost | Interrupted::Superseded) => report.lost += 1,
                        Err(Interrupted::Transient { .. } | Interrupted::Waiting { .. }) => {
                            report.released += 1;
                        }
                        Err(Interrupted::NeedsHuman { .. }) => report.flagged += 1,
                    }
                }
            }
        }
        Ok(())
    }
}
