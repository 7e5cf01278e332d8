//! The job runner: receipts, the looks at payments that wait on their customers
//! (`payments_domain::authentication`), and every staged job that is not a webhook delivery (a
//! kind a newer release staged, say), on a loop of their own, so that neither a stuck delivery
//! nor a long receipt queue holds the other back.

use payments_domain::authentication::{self, Checked};
use payments_domain::jobs::{self as queue, Work};
use provider::CardProcessor;
use tokio::sync::watch;

use crate::jobs;
use crate::{MAX_BATCHES_PER_PASS, PassReport, Worker};

impl<P: CardProcessor> Worker<P> {
    /// The job runner. Like the completer, it claims one job at a time, when its turn comes,
    /// so that a claim never waits behind other jobs' sends. Deliveries are not among them: they
    /// run concurrently, claimed fairly, on their own loop ([`Worker::run_deliveries`]).
    pub async fn run_jobs(
        &self,
        stop: &watch::Receiver<bool>,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        let most = MAX_BATCHES_PER_PASS.saturating_mul(self.settings.batch_size as usize);
        for _ in 0..most {
            if *stop.borrow() {
                break;
            }
            let Some(job) = jobs::claim(&self.ctx.pool, 1).await?.pop() else { break };
            let kind = match &job.work {
                Ok(work) => work.kind().to_string(),
                Err(unreadable) => unreadable.kind.clone(),
            };
            let span = tracing::info_span!("job", job_id = job.id, %kind, attempt = job.attempts);
            let outcome = match &job.work {
                // Not claimed here (a delivery names its endpoint), but run as one all the same.
                Ok(Work::Webhook(_)) => {
                    report.add(&self.run_delivery(job).await?);
                    continue;
                }
                Ok(Work::Receipt(receipt)) => tracing::Instrument::instrument(
                    self.receipts.send(&self.ctx.pool, receipt),
                    span.clone(),
                )
                .await
                .map(|_| Checked::Done),
                Ok(Work::Authentication(waiting)) => {
                    let (pool, processor) = (&self.ctx.pool, &*self.ctx.processor);
                    let settings = &self.ctx.authentication;
                    tracing::Instrument::instrument(
                        authentication::check(pool, processor, settings, waiting, job.id),
                        span.clone(),
                    )
                    .await
                }
                // A kind this release does not know, or a payload that is not its input: failed
                // like any job, so a newer release may still run it before it is dead-lettered.
                Err(unreadable) => Err(unreadable.to_string()),
            };
            match outcome {
                Ok(Checked::Done) => {
                    if queue::done(&self.ctx.pool, job.id, job.attempts).await? {
                        report.jobs_done += 1;
                    } else {
                        tracing::warn!(parent: &span, "another runner claimed the job meanwhile; its run decides");
                    }
                }
                Ok(Checked::Later(delay)) => {
                    if !queue::again(&self.ctx.pool, job.id, job.attempts, delay).await? {
                        tracing::warn!(parent: &span, "another runner claimed the job meanwhile; its run decides");
                    }
                }
                Err(error) => {
                    let delay = self.job_backoff().delay(u32::try_from(job.attempts).unwrap_or(0));
                    self.job_failed(&job, &error, delay, &span, report).await?;
                }
            }
        }
        Ok(())
    }

    /// Records that `job` failed with `error`: it runs again after `delay`, or is dead-lettered
    /// once it has had `worker.job_max_attempts` attempts. A look at a payment that waits on its
    /// customer is never dead-lettered: its attempts count its waits too, and only it settles
    /// the payment if no webhook comes (its delay is capped by the back-off).
    pub(crate) async fn job_failed(
        &self,
        job: &queue::Job,
        error: &str,
        delay: std::time::Duration,
        span: &tracing::Span,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        let waits = matches!(job.work, Ok(Work::Authentication(_)));
        let dead = !waits
            && u32::try_from(job.attempts).unwrap_or(u32::MAX) >= self.settings.job_max_attempts;
        if !queue::failed(&self.ctx.pool, job.id, job.attempts, error, delay, dead).await? {
            tracing::warn!(parent: span, error, "job failed, and another runner claimed it meanwhile");
        } else if dead {
            tracing::error!(parent: span, error, "job dead-lettered");
            report.jobs_dead += 1;
        } else {
            tracing::warn!(parent: span, error, retry_in_ms = delay.as_millis() as u64, "job failed; will retry");
            report.jobs_retried += 1;
        }
        Ok(())
    }
}
