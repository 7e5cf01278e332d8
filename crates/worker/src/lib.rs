//! The background worker: what makes sure every key reaches a final answer, that old keys go
//! away, and that work staged in a transaction happens after it.
//!
//! - **Completer**: takes unfinished keys whose lease is free or expired and whose next attempt
//!   is due (`FOR UPDATE SKIP LOCKED`), one at a time, and drives each to its end through the very operations
//!   the API runs (`payments_domain::operations::resume`); no HTTP, no second implementation.
//!   Keys past the attempt bound or the processor's idempotency window are flagged for a person.
//! - **Reaper**: deletes completed keys past the retention window, in bounded batches; flags
//!   unfinished ones instead of deleting them. Payments never refer to keys by foreign key, so
//!   nothing is orphaned.
//! - **Job runner**: runs staged jobs (receipts, webhook deliveries) at least once, one at a
//!   time, with back-off and a dead letter; a receipt sent twice carries one `Message-ID`, a
//!   webhook delivered twice one event id.
//!
//! Every loop is bounded and stops between items when asked to: the item in hand is finished.
//! Any number of workers can run against one database.

pub mod jobs;
pub mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use idem::{Due, Engine, Interrupted, NoObserver};
use payments_backoff::{Backoff, Jitter};
use payments_domain::jobs::{self as queue, Job, WebhookJob, Work};
use payments_domain::operations::{self, Context};
use payments_settings::{Settings, WorkerSettings};
use provider::{CardProcessor, ProcessorClient};
use sqlx::PgPool;
use tokio::sync::watch;

use crate::jobs::{LogMailer, Mailer, SmtpMailer};
use crate::webhooks::{Delivered, Deliverer};

/// At most this many batches per loop in one pass, so a pass always ends.
const MAX_BATCHES_PER_PASS: usize = 20;

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
}

impl PassReport {
    /// Adds the pass to the worker's counters.
    fn count(&self) {
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
    }

    /// Whether the pass found any work.
    pub fn found_work(&self) -> bool {
        *self != Self::default()
    }
}

/// The worker's loops, run side by side ([`Worker::run_until`]).
#[derive(Debug, Clone, Copy)]
enum Loop {
    /// Drives unfinished keys to their answers (`Worker::complete`).
    Completer,
    /// Deletes expired keys and runs staged jobs (`Worker::reap`, `Worker::run_jobs`).
    Upkeep,
}

impl Loop {
    fn name(self) -> &'static str {
        match self {
            Loop::Completer => "completer",
            Loop::Upkeep => "upkeep",
        }
    }
}

/// A worker over one database and processor.
pub struct Worker<P> {
    ctx: Context<P>,
    engine: Engine,
    settings: WorkerSettings,
    mailer: Arc<dyn Mailer>,
    deliverer: Deliverer,
}

impl<P> std::fmt::Debug for Worker<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// Builds the worker the settings describe, with the real processor client and mailer.
pub fn build(settings: &Settings) -> anyhow::Result<Worker<ProcessorClient>> {
    let pool = settings.database.pool()?;
    let processor = ProcessorClient::new(settings.processor.client_config())?;
    let smtp_url = payments_settings::ExposeSecret::expose_secret(&settings.worker.smtp_url);
    let mailer: Arc<dyn Mailer> = if smtp_url.is_empty() {
        Arc::new(LogMailer)
    } else {
        Arc::new(SmtpMailer::new(smtp_url, &settings.worker.receipt_from)?)
    };
    let public_base_url = settings.public_base_url(settings.http.port);
    Worker::new(pool, Arc::new(processor), public_base_url.into(), settings, mailer)
}

impl<P: CardProcessor> Worker<P> {
    /// A worker with the given parts (tests pass their own processor and mailer).
    pub fn new(
        pool: PgPool,
        processor: Arc<P>,
        public_base_url: Arc<str>,
        settings: &Settings,
        mailer: Arc<dyn Mailer>,
    ) -> anyhow::Result<Self> {
        let engine = Engine::new(pool.clone(), settings.engine_config(), Arc::new(NoObserver));
        Ok(Self {
            ctx: Context::new(pool, processor, public_base_url)
                .with_charge_metadata(settings.processor.charge_metadata.clone())
                .with_batches(settings.idempotency.batch_phases)
                .with_fast_path(settings.idempotency.fast_path),
            engine,
            settings: settings.worker.clone(),
            mailer,
            deliverer: Deliverer::new(&settings.webhooks)?,
        })
    }

    /// The delay before a failed job runs again: its base doubling per attempt, without jitter
    /// (one runner retries one job), stopping after 16 doublings.
    fn job_backoff(&self) -> Backoff {
        let base = Duration::from_millis(self.settings.job_backoff_base_ms);
        Backoff::new(base, base.saturating_mul(1 << 16), Jitter::None)
    }

    /// One pass of each loop, one after the other, stopping between items once `stop` turns
    /// true (`payments-worker --once`, and tests).
    pub async fn run_once(&self, stop: &watch::Receiver<bool>) -> anyhow::Result<PassReport> {
        self.pass(&[Loop::Completer, Loop::Upkeep], stop).await
    }

    /// Runs the loops until `stop` turns true. The completer runs apart from the reaper and the
    /// job runner: its calls last as long as the processor makes them (through an outage, a
    /// timeout per key for every due key), and receipts, webhook deliveries and the reaper must
    /// not wait behind them.
    pub async fn run_until(&self, stop: watch::Receiver<bool>) {
        tokio::join!(
            self.keep_passing(Loop::Completer, stop.clone()),
            self.keep_passing(Loop::Upkeep, stop)
        );
        tracing::info!("worker stopped");
    }

    /// Passes of one loop until `stop` turns true, pausing when a pass found nothing. A failed
    /// pass (the database is away, say) is logged and tried again after the pause.
    async fn keep_passing(&self, which: Loop, mut stop: watch::Receiver<bool>) {
        let interval = Duration::from_millis(self.settings.interval_ms);
        while !*stop.borrow() {
            let busy = match self.pass(&[which], &stop).await {
                Ok(report) => report.found_work(),
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), worker_loop = which.name(), "worker pass failed; trying again");
                    false
                }
            };
            if !busy {
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }

    /// One pass of each of `loops`, in turn, counted in the worker's metrics.
    async fn pass(
        &self,
        loops: &[Loop],
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<PassReport> {
        let mut report = PassReport::default();
        for which in loops {
            match which {
                Loop::Completer => self.complete(stop, &mut report).await?,
                Loop::Upkeep => {
                    self.reap(stop, &mut report).await?;
                    self.run_jobs(stop, &mut report).await?;
                }
            }
        }
        if report.found_work() {
            let loops: Vec<&str> = loops.iter().map(|l| l.name()).collect();
            tracing::info!(?report, ?loops, "worker pass");
        }
        report.count();
        Ok(report)
    }

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

    /// The job runner. Like the completer, it claims one job at a time, when its turn comes,
    /// so that a claim never waits behind other jobs' sends.
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
                Ok(Work::Webhook(delivery)) => {
                    // Its own schedule (back-off to a horizon) and its own log; see `webhooks`.
                    self.deliver(&job, delivery, &span, report).await?;
                    continue;
                }
                Ok(Work::Receipt(receipt)) => {
                    tracing::Instrument::instrument(
                        jobs::send_receipt(&self.ctx.pool, self.mailer.as_ref(), receipt),
                        span.clone(),
                    )
                    .await
                }
                // A kind this release does not know, or a payload that is not its input: failed
                // like any job, so a newer release may still run it before it is dead-lettered.
                Err(unreadable) => Err(unreadable.to_string()),
            };
            match outcome {
                Ok(_) => {
                    if queue::done(&self.ctx.pool, job.id, job.attempts).await? {
                        report.jobs_done += 1;
                    } else {
                        tracing::warn!(parent: &span, "another runner claimed the job meanwhile; its run decides");
                    }
                }
                Err(error) => {
                    let dead = u32::try_from(job.attempts).unwrap_or(u32::MAX)
                        >= self.settings.job_max_attempts;
                    let delay = self.job_backoff().delay(u32::try_from(job.attempts).unwrap_or(0));
                    if !queue::failed(&self.ctx.pool, job.id, job.attempts, &error, delay, dead)
                        .await?
                    {
                        tracing::warn!(parent: &span, error, "job failed, and another runner claimed it meanwhile");
                    } else if dead {
                        tracing::error!(parent: &span, error, "job dead-lettered");
                        report.jobs_dead += 1;
                    } else {
                        tracing::warn!(parent: &span, error, retry_in_ms = delay.as_millis() as u64, "job failed; will retry");
                        report.jobs_retried += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs a claimed `webhook` job, the delivery `work`, and counts what came of it.
    async fn deliver(
        &self,
        job: &Job,
        work: &WebhookJob,
        span: &tracing::Span,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        let delivered = tracing::Instrument::instrument(
            self.deliverer.run(&self.ctx.pool, job, work),
            span.clone(),
        )
        .await;
        match delivered {
            Ok(Delivered::Done) => report.jobs_done += 1,
            Ok(Delivered::Retrying) => report.jobs_retried += 1,
            Ok(Delivered::Dead) => {
                tracing::error!(parent: span, "webhook delivery dead-lettered");
                report.jobs_dead += 1;
            }
            Ok(Delivered::Lost) => {
                tracing::warn!(parent: span, "another runner claimed the delivery meanwhile; its run decides");
            }
            // The job could not be run at all (the database failed, or it names no event):
            // retried like any job, and dead-lettered after the same bound.
            Err(error) => {
                let dead = u32::try_from(job.attempts).unwrap_or(u32::MAX)
                    >= self.settings.job_max_attempts;
                let delay = self.deliverer.backoff(job.attempts);
                queue::failed(&self.ctx.pool, job.id, job.attempts, &error, delay, dead).await?;
                tracing::warn!(parent: span, error, dead, "webhook job failed");
                if dead {
                    report.jobs_dead += 1;
                } else {
                    report.jobs_retried += 1;
                }
            }
        }
        Ok(())
    }
}
