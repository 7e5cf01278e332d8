//! The background worker: what makes sure every key reaches a final answer, that old keys go
//! away, and that work staged in a transaction happens after it.
//!
//! - **Completer**: takes unfinished keys whose lease is free or expired and whose next attempt
//!   is due (`FOR UPDATE SKIP LOCKED`), one at a time, and drives each to its end through the very operations
//!   the API runs (`payments_domain::operations::resume`); no HTTP, no second implementation.
//!   Keys past the attempt bound or the processor's idempotency window are flagged for a person.
//! - **Reaper**: deletes everything past its retention, in bounded batches: completed keys past
//!   their window (unfinished ones are flagged instead; payments never refer to keys by foreign
//!   key, so nothing is orphaned), then events, webhook attempts, audit records, processor events
//!   and finished jobs past `[retention]` (`payments_domain::retention`).
//! - **Job runner**: runs staged receipts at least once, one at a time, with back-off and a dead
//!   letter; a receipt sent twice carries one `Message-ID`.
//! - **Deliveries**: run webhook deliveries at least once, concurrently, claimed fairly across
//!   accounts under caps per account and per endpoint, with back-off to a horizon; a webhook
//!   delivered twice carries one event id. An endpoint that keeps failing is paused, then
//!   disabled.
//!
//! Each runs on a loop of its own, so that none waits behind another's slow work (a processor
//! outage, a silent webhook endpoint, a long receipt queue). Every loop is bounded and stops
//! between items when asked to: the items in hand are finished. Any number of workers can run
//! against one database.

mod completer;
pub mod deliveries;
mod job_runner;
pub mod jobs;
mod reaper;
mod report;
pub mod webhooks;

pub use report::PassReport;

use std::sync::Arc;
use std::time::Duration;

use idem::{Engine, NoObserver};
use payments_backoff::{Backoff, Jitter};
use payments_domain::authentication::AuthenticationSettings;
use payments_domain::operations::Context;
use payments_settings::{Settings, WorkerSettings};
use provider::{CardProcessor, ProcessorClient};
use sqlx::PgPool;
use tokio::sync::watch;

use crate::deliveries::Until;
use crate::jobs::{LogMailer, Mailer, ReceiptSender, SmtpMailer};
use crate::reaper::Walks;
use crate::webhooks::Deliverer;

/// At most this many batches per loop in one pass (per table, for the reaper's retention), so a
/// pass always ends.
pub const MAX_BATCHES_PER_PASS: usize = 20;

/// The worker's loops, run side by side ([`Worker::run_until`]).
#[derive(Debug, Clone, Copy)]
enum Loop {
    /// Drives unfinished keys to their answers (`Worker::complete`).
    Completer,
    /// Deletes keys and rows past their retention (`Worker::reap`).
    Reaper,
    /// Sends receipts (`Worker::run_jobs`).
    Receipts,
    /// Delivers webhooks (`Worker::run_deliveries`).
    Deliveries,
}

impl Loop {
    fn name(self) -> &'static str {
        match self {
            Loop::Completer => "completer",
            Loop::Reaper => "reaper",
            Loop::Receipts => "receipts",
            Loop::Deliveries => "deliveries",
        }
    }
}

/// A worker over one database and processor.
pub struct Worker<P> {
    ctx: Context<P>,
    engine: Engine,
    settings: WorkerSettings,
    receipts: ReceiptSender,
    deliverer: Deliverer,
    /// The reaper's walks over the tables that only grow.
    walks: Walks,
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
        let sealing_keys = webhooks::sealing_keys(settings)?;
        Ok(Self {
            ctx: Context::new(pool, processor, public_base_url.clone(), sealing_keys.clone())
                .with_charge_metadata(settings.processor.charge_metadata.clone())
                .with_authentication(AuthenticationSettings::configured(
                    settings.processor.return_url(&public_base_url),
                    settings.processor.authentication_check_after(),
                    settings.processor.authentication_expires_after(),
                ))
                .with_batches(settings.idempotency.batch_phases)
                .with_fast_path(settings.idempotency.fast_path),
            engine,
            settings: settings.worker.clone(),
            receipts: ReceiptSender::new(mailer, &settings.worker),
            deliverer: Deliverer::new(&settings.webhooks, sealing_keys)?,
            walks: Walks::new(&settings.retention),
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
        self.pass(&[Loop::Completer, Loop::Reaper, Loop::Receipts, Loop::Deliveries], stop).await
    }

    /// Runs the loops side by side until `stop` turns true. Each waits on its own work only: the
    /// completer's calls last as long as the processor makes them (through an outage, a timeout
    /// per key for every due key), a delivery as long as its receiver (up to
    /// `webhooks.timeout_ms`), a receipt as long as the mail server, and none of the others
    /// waits behind them; the reaper neither.
    pub async fn run_until(&self, stop: watch::Receiver<bool>) {
        let mut delivered = PassReport::default();
        let (_, _, _, deliveries) = tokio::join!(
            self.keep_passing(Loop::Completer, stop.clone()),
            self.keep_passing(Loop::Reaper, stop.clone()),
            self.keep_passing(Loop::Receipts, stop.clone()),
            self.deliveries(&stop, &mut delivered, Until::Stopped),
        );
        if let Err(err) = deliveries {
            tracing::warn!(error = %format!("{err:#}"), "the delivery loop failed");
        }
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
                Loop::Reaper => self.reap(stop, &mut report).await?,
                Loop::Receipts => self.run_jobs(stop, &mut report).await?,
                Loop::Deliveries => self.run_deliveries(stop, &mut report).await?,
            }
        }
        if report.found_work() {
            let loops: Vec<&str> = loops.iter().map(|l| l.name()).collect();
            tracing::info!(?report, ?loops, "worker pass");
        }
        report.count();
        Ok(report)
    }
}
