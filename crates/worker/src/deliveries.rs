//! The delivery loop: webhook deliveries run concurrently, up to `webhooks.max_deliveries` at
//! once, taken from the queue fairly across accounts and under caps per account and per endpoint
//! (`payments_domain::deliveries::claim`), so that one account's silent endpoints hold at most
//! that account's places, and every other account's deliveries go out beside them.
//!
//! The loop claims whenever it has a free place: when a delivery ends, and at least every
//! `worker.interval_ms` while deliveries run (a delivery of another account may have fallen due
//! behind a slow one). Asked to stop, it claims nothing more and finishes the deliveries in hand
//! (each bounded by `webhooks.timeout_ms`). A worker that dies mid-delivery leaves its claims,
//! which run out; until then they count toward the caps.

use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use payments_domain::deliveries;
use payments_domain::jobs::{Job, Work};
use provider::CardProcessor;
use tokio::sync::watch;

use crate::webhooks::Delivered;
use crate::{MAX_BATCHES_PER_PASS, PassReport, Worker, jobs};

/// How long the loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Until nothing is due and nothing runs: one pass (`--once`, tests).
    Idle,
    /// Until asked to stop: the long-running worker. Its counts go to the metrics as each
    /// delivery ends.
    Stopped,
}

impl<P: CardProcessor> Worker<P> {
    /// Runs the due deliveries, concurrently under the caps, until none is due and none runs, or
    /// until `stop` turns true (then the deliveries in hand are finished). One pass: at most
    /// as many claims as the other loops take jobs in one.
    pub async fn run_deliveries(
        &self,
        stop: &watch::Receiver<bool>,
        report: &mut PassReport,
    ) -> anyhow::Result<()> {
        self.deliveries(stop, report, Until::Idle).await
    }

    /// The loop (see the module). With [`Until::Idle`] the first error ends it, once the
    /// deliveries in hand are finished; with [`Until::Stopped`] an error is logged, and the loop
    /// looks again after a pause.
    pub(crate) async fn deliveries(
        &self,
        stop: &watch::Receiver<bool>,
        report: &mut PassReport,
        until: Until,
    ) -> anyhow::Result<()> {
        let interval = Duration::from_millis(self.settings.interval_ms);
        let most = MAX_BATCHES_PER_PASS.saturating_mul(self.settings.batch_size as usize);
        let mut stop = stop.clone();
        let mut running = FuturesUnordered::new();
        let (mut claimed, mut failure, mut stop_gone) = (0_usize, None, false);
        loop {
            let stopping = *stop.borrow()
                || stop_gone
                || failure.is_some()
                || (until == Until::Idle && claimed >= most);
            let free = self.deliverer.max_deliveries().saturating_sub(running.len());
            let mut found = 0;
            if !stopping && free > 0 {
                match self.claim_deliveries(free).await {
                    Ok(jobs) => {
                        found = jobs.len();
                        claimed += found;
                        running.extend(jobs.into_iter().map(|job| self.run_delivery(job)));
                    }
                    Err(err) if until == Until::Idle => failure = Some(err),
                    Err(err) => {
                        tracing::warn!(error = %format!("{err:#}"), "claiming deliveries failed; trying again");
                    }
                }
            }
            if running.is_empty() {
                if stopping || (until == Until::Idle && found == 0) {
                    break;
                }
                if found == 0 {
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        changed = stop.changed() => stop_gone = changed.is_err(),
                    }
                }
                continue;
            }
            // A delivery ends, or it is time to look at the queue again, or to stop.
            tokio::select! {
                Some(ended) = running.next() => match ended {
                    Ok(one) => {
                        if until == Until::Stopped {
                            one.count();
                        }
                        report.add(&one);
                    }
                    Err(err) if until == Until::Idle => failure = failure.or(Some(err)),
                    Err(err) => tracing::warn!(error = %format!("{err:#}"), "a delivery could not be recorded"),
                },
                () = tokio::time::sleep(interval), if !stopping => {}
                changed = stop.changed(), if !stopping => stop_gone = changed.is_err(),
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Claims up to `free` due deliveries; first drops, unsent, those of endpoints disabled or
    /// deleted since their event.
    async fn claim_deliveries(&self, free: usize) -> anyhow::Result<Vec<Job>> {
        let pool = &self.ctx.pool;
        let dropped = deliveries::drop_undeliverable(pool, self.settings.batch_size).await?;
        if dropped > 0 {
            tracing::info!(dropped, "deliveries to disabled or deleted endpoints dropped");
        }
        let limit = u32::try_from(free).unwrap_or(u32::MAX);
        Ok(deliveries::claim(pool, limit, self.deliverer.caps(), jobs::CLAIM).await?)
    }

    /// Runs one claimed delivery: what came of it.
    pub(crate) async fn run_delivery(&self, job: Job) -> anyhow::Result<PassReport> {
        let mut report = PassReport::default();
        let span =
            tracing::info_span!("job", job_id = job.id, kind = "webhook", attempt = job.attempts);
        let delivered = match &job.work {
            Ok(Work::Webhook(work)) => {
                let run = self.deliverer.run(&self.ctx.pool, &job, work);
                tracing::Instrument::instrument(run, span.clone()).await
            }
            Ok(other) => Err(format!("a {} job among the deliveries", other.kind())),
            Err(unreadable) => Err(unreadable.to_string()),
        };
        match delivered {
            Ok(Delivered::Done) => report.jobs_done += 1,
            Ok(Delivered::Retrying) => report.jobs_retried += 1,
            Ok(Delivered::Dead) => {
                tracing::error!(parent: &span, "webhook delivery dead-lettered");
                report.jobs_dead += 1;
            }
            Ok(Delivered::Lost) => {
                tracing::warn!(parent: &span, "another runner claimed the delivery meanwhile; its run decides");
            }
            // The job could not be run at all (the database failed, or it names no event):
            // retried like any job, and dead-lettered after the same bound.
            Err(error) => {
                let delay = self.deliverer.backoff(job.attempts);
                self.job_failed(&job, &error, delay, &span, &mut report).await?;
            }
        }
        Ok(report)
    }
}
