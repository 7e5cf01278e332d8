//! A phase sent as one statement that commits on its own ([`OneStatement`],
//! [`Lease::phase_in_one`]): the operation's writes and the fence (`idem_commit_fence`) in one
//! round trip instead of a transaction's four, sent in a batch when the operation offers one
//! (`crate::batch`), else on a side connection (`connections.rs`).

use std::future::Future;

use sqlx::PgConnection;
use tracing::Instrument;

use super::super::lease::Lease;
use super::super::phase::Step;
use super::super::{DB_RETRY, RecoveryPoint};
use crate::error::{PhaseError, is_retryable};
use crate::observe::Event;
use crate::store::FenceRecord;

/// An atomic phase sent as a single statement, which commits on its own (autocommit): one round
/// trip instead of a transaction's four. Its step is decided before it runs, because the fence
/// that moves the key is part of the statement. Run by [`Lease::phase_in_one`].
pub trait OneStatement: Send {
    /// The operation's recovery points.
    type Point: RecoveryPoint;
    /// The operation's own error.
    type Error: Send;
    /// What the statement returns besides the fence's key id (the rows it wrote).
    type Output: Send;

    /// Where the statement leaves the key.
    fn step(&self) -> Step<Self::Point>;

    /// Sends one statement that makes the operation's writes and calls
    /// `idem_commit_fence($n)` with `fence` bound as `$n` (a data-modifying CTE, say), and
    /// returns the key id `idem_commit_fence` returned beside its own result. May run more than
    /// once (after a conflict), so it decides the same way each time.
    ///
    /// `connection` goes back to the engine's kept connections unchecked when `run` returns, so
    /// `run` sends that one statement and reads its answer to the end (`fetch_one`,
    /// `fetch_optional`, `execute`: not a stream dropped half way), and changes nothing of the
    /// session (no `SET`, no `BEGIN`).
    fn run(
        &mut self,
        connection: &mut PgConnection,
        fence: &FenceRecord,
    ) -> impl Future<Output = Result<(i64, Self::Output), PhaseError<Self::Error>>> + Send;

    /// Sends the statement's writes as a row of a batch (`crate::batch`) instead, and returns
    /// what [`OneStatement::run`] would have: the key id the fence returned and the output. `None`
    /// (the default: the statement is not batched) when the row must go alone: the engine then
    /// calls `run`. The batch writes the row whole or not at all, so `None` means nothing of it
    /// was written, or, when the batch's answer was lost, that it may have been: `run` must then
    /// find its own rows moved on (as at a version check) or the fence the lease gone, as when
    /// its own answer is lost. May run more than once, as `run`.
    fn run_batched(
        &mut self,
        fence: &FenceRecord,
    ) -> impl Future<Output = Option<(i64, Self::Output)>> + Send {
        let _ = fence;
        std::future::ready(None)
    }
}

impl Lease {
    /// Runs one atomic phase as a single statement, which commits on its own, and answers what
    /// the statement returned. As a [`FencedTx`](crate::FencedTx)'s phase: fenced on the lease,
    /// a new key stored with it (or [`PhaseError::Superseded`]), and run again after a conflict.
    pub async fn phase_in_one<S: OneStatement>(
        &mut self,
        mut statement: S,
    ) -> Result<S::Output, PhaseError<S::Error>> {
        let engine = self.engine.clone();
        let _granting = engine.granting_new(self.new.is_some())?;
        let span = self.phase_span();
        let step = statement.step();
        let fence = self.fence_of(&step, self.new.is_some())?;
        let mut tries = 0;
        loop {
            let attempt = async {
                if self.finished.is_some() {
                    return Err(PhaseError::LeaseLost);
                }
                match self.run_in_one(&mut statement, &fence).await {
                    Ok((key_id, made)) if key_id == self.key_id => Ok((step.clone(), made)),
                    Ok(_) => Err(PhaseError::Database(sqlx::Error::Protocol(
                        "a one-statement phase did not return its fence's key".into(),
                    ))),
                    Err(PhaseError::Database(err)) => Err(self.fence_error(err)),
                    Err(other) => Err(other),
                }
            }
            .instrument(span.clone())
            .await;
            if let Some(settled) = self.settle(attempt, &span, &mut tries).await {
                return settled.map(|(_, made)| made);
            }
        }
    }

    /// Sends the statement once: in a batch when it is batched and the batch took it, else on a
    /// side connection (`connections.rs`) or a pooled one.
    async fn run_in_one<S: OneStatement>(
        &self,
        statement: &mut S,
        fence: &FenceRecord,
    ) -> Result<(i64, S::Output), PhaseError<S::Error>> {
        if let Some(sent) = statement.run_batched(fence).await {
            return Ok(sent);
        }
        let Some(kept) = self.engine.phase_connections() else {
            let mut pooled = self.engine.pool.acquire().await?;
            return statement.run(&mut pooled, fence).await;
        };
        let mut lent = kept.lend().await?;
        let sent = statement.run(lent.connection(), fence).await;
        lent.give_back(match &sent {
            Err(PhaseError::Database(err)) => Some(err),
            _ => None,
        });
        sent
    }

    /// What one attempt at a phase comes to: `None` to run it again (a retryable database
    /// error, after a pause), else its result, with the lease moved along when it committed.
    async fn settle<P, E, T>(
        &mut self,
        attempt: Result<(Step<P>, T), PhaseError<E>>,
        span: &tracing::Span,
        tries: &mut u32,
    ) -> Option<Result<(Step<P>, T), PhaseError<E>>>
    where
        P: RecoveryPoint,
    {
        match attempt {
            Err(PhaseError::Database(err))
                if is_retryable(&err) && *tries < self.engine.config.db_retries =>
            {
                *tries += 1;
                self.engine.observer.event(Event::DatabaseRetry);
                tokio::time::sleep(DB_RETRY.delay(*tries)).await;
                None
            }
            Err(PhaseError::LeaseLost) => {
                self.engine.observer.event(Event::LeaseLost);
                tracing::warn!(parent: span, "lease lost: the phase was rolled back");
                Some(Err(PhaseError::LeaseLost))
            }
            Err(PhaseError::Superseded) => {
                // Not counted here: the claim that follows counts what the key turned out to be.
                tracing::debug!(parent: span, "another request stored the new key first: the phase was rolled back");
                Some(Err(PhaseError::Superseded))
            }
            Err(other) => Some(Err(other)),
            Ok((step, made)) => {
                self.moved(&step, span);
                Some(self.stored().await.map(|()| (step, made)))
            }
        }
    }
}
