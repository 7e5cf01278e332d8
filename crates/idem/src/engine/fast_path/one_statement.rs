//! A phase sent as one statement that commits on its own ([`Lease::phase_in_one`]): the
//! operation's writes and the fence (`idem_commit_fence`) in one round trip instead of a
//! transaction's four, on a side connection (`connections.rs`); or as a row of a batch of such
//! statements ([`Lease::phase_in_batch`], `crate::batch`).

use std::convert::Infallible;
use std::time::Duration;

use sqlx::PgConnection;
use tracing::Instrument;

use super::super::lease::Lease;
use super::super::phase::Step;
use super::super::{DB_RETRY, RecoveryPoint};
use crate::batch::{Batch, Batcher};
use crate::error::{PhaseError, is_retryable};
use crate::observe::Event;
use crate::store::FenceRecord;

/// The `statement_timeout` of the connections kept for one-statement phases: such a phase takes
/// milliseconds, and one that waits this long waits for a lock. It fails
/// ([`PhaseError::timed_out`]) having written nothing, and the operation runs its general phase
/// instead, which holds its key from its first statement however long it then waits. Part of the
/// lease's margin (`EngineConfig::check_lease_covers`). On the pool (no kept connections) the
/// pool's own `statement_timeout` applies.
pub const ONE_STATEMENT_TIMEOUT: Duration = Duration::from_secs(1);

impl Lease {
    /// Runs one atomic phase that ends with `step` as a single statement, which commits on its
    /// own, and answers what the statement returned. `send` sends one statement that makes the
    /// operation's writes and calls `idem_commit_fence($n)` with the fence it is given bound as
    /// `$n` (a data-modifying CTE, say), and returns the key id `idem_commit_fence` returned
    /// beside its own result.
    ///
    /// As a [`FencedTx`](crate::FencedTx)'s phase: fenced on the lease, a new key stored with it
    /// (or [`PhaseError::Superseded`]), and sent again after a conflict, so `send` decides the
    /// same way each time. Its connection goes back to the engine's side connections unchecked
    /// when `send` returns, so `send` sends that one statement and reads its answer to the end
    /// (`fetch_one`, `fetch_optional`, `execute`: not a stream dropped half way), and changes
    /// nothing of the session (no `SET`, no `BEGIN`).
    pub async fn phase_in_one<P, T, E>(
        &mut self,
        step: Step<P>,
        send: impl AsyncFnOnce(&mut PgConnection, &FenceRecord) -> Result<(i64, T), PhaseError<E>>
        + Clone,
    ) -> Result<T, PhaseError<E>>
    where
        P: RecoveryPoint,
    {
        let engine = self.engine.clone();
        let _granting = engine.granting_new(self.new.is_some())?;
        let span = self.phase_span();
        let fence = self.fence_of(&step, self.new.is_some())?;
        let mut tries = 0;
        loop {
            let attempt = async {
                if self.finished.is_some() {
                    return Err(PhaseError::LeaseLost);
                }
                match self.send_alone(&send, &fence).await {
                    Ok((key_id, made)) => self.check_key(key_id).map(|()| made),
                    Err(PhaseError::Database(err)) => Err(self.fence_error(err)),
                    Err(other) => Err(other),
                }
            }
            .instrument(span.clone())
            .await;
            match attempt {
                Err(PhaseError::Database(err))
                    if is_retryable(&err) && tries < self.engine.config.db_retries =>
                {
                    tries += 1;
                    self.engine.observer.event(Event::DatabaseRetry);
                    tokio::time::sleep(DB_RETRY.delay(tries)).await;
                }
                attempt => return self.settle(attempt, &step, &span).await,
            }
        }
    }

    /// The phase of [`Lease::phase_in_one`] as a row of a batch (`crate::batch`): `row`, the
    /// writes the operation's [`Batch`] makes for it, sent with the fence for `step` in the next
    /// batch of `batcher`. `Ok(true)` when the batch wrote it; `Ok(false)` when the row must go
    /// alone, with `phase_in_one`: the batch failed, wrote nothing for the row (its own check did
    /// not hold), or lost its answer (then `phase_in_one` finds its own rows moved on, as at a
    /// version check, or the fence the lease gone, as when its own answer is lost). A row is
    /// offered to a batch once: a conflict is retried by `phase_in_one`, alone.
    pub async fn phase_in_batch<P, B>(
        &mut self,
        step: &Step<P>,
        batcher: &Batcher<B>,
        row: B::Row,
    ) -> Result<bool, PhaseError<Infallible>>
    where
        P: RecoveryPoint,
        B: Batch,
    {
        let engine = self.engine.clone();
        let _granting = engine.granting_new(self.new.is_some())?;
        if self.finished.is_some() {
            return Err(PhaseError::LeaseLost);
        }
        let span = self.phase_span();
        let fence = self.fence_of(step, self.new.is_some())?;
        let Some(key_id) = batcher.send(row, &fence).instrument(span.clone()).await else {
            return Ok(false);
        };
        let written = self.check_key(key_id);
        self.settle(written, step, &span).await.map(|()| true)
    }

    /// Sends the statement once, on a side connection (`connections.rs`) or a pooled one.
    async fn send_alone<T, E>(
        &self,
        send: &(
             impl AsyncFnOnce(&mut PgConnection, &FenceRecord) -> Result<(i64, T), PhaseError<E>> + Clone
         ),
        fence: &FenceRecord,
    ) -> Result<(i64, T), PhaseError<E>> {
        let Some(kept) = self.engine.phase_connections() else {
            let mut pooled = self.engine.pool.acquire().await?;
            return (send.clone())(&mut pooled, fence).await;
        };
        let mut lent = kept.lend().await?;
        let sent = (send.clone())(lent.connection(), fence).await;
        lent.give_back(match &sent {
            Err(PhaseError::Database(err)) => Some(err),
            _ => None,
        });
        sent
    }

    /// That the fence a statement called returned this lease's key.
    fn check_key<E>(&self, key_id: i64) -> Result<(), PhaseError<E>> {
        if key_id == self.key_id {
            return Ok(());
        }
        Err(PhaseError::Database(sqlx::Error::Protocol(
            "a one-statement phase did not return its fence's key".into(),
        )))
    }

    /// What a phase sent as one statement came to, its retries done: with the lease moved along
    /// to `step` when it committed.
    async fn settle<P, T, E>(
        &mut self,
        attempt: Result<T, PhaseError<E>>,
        step: &Step<P>,
        span: &tracing::Span,
    ) -> Result<T, PhaseError<E>>
    where
        P: RecoveryPoint,
    {
        match attempt {
            Err(PhaseError::LeaseLost) => {
                self.engine.observer.event(Event::LeaseLost);
                tracing::warn!(parent: span, "lease lost: the phase was rolled back");
                Err(PhaseError::LeaseLost)
            }
            Err(PhaseError::Superseded) => {
                // Not counted here: the claim that follows counts what the key turned out to be.
                tracing::debug!(parent: span, "another request stored the new key first: the phase was rolled back");
                Err(PhaseError::Superseded)
            }
            Err(other) => Err(other),
            Ok(made) => {
                self.moved(step, span);
                self.stored().await.map_err(|_| PhaseError::LeaseLost)?;
                Ok(made)
            }
        }
    }
}
