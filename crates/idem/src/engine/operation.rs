//! Writing an operation against the engine: the [`Operation`] trait and how a step is
//! interrupted ([`Interrupted`]), the loop that drives it from its recovery point to its end
//! ([`drive`]), and its atomic phases ([`Phase`], [`Lease::phase`]): one transaction of the
//! operation's writes that moves the key to its next recovery point or stores the final answer,
//! fenced on the lease.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use sqlx::PgConnection;
use tracing::Instrument;

use super::lease::Lease;
use super::{DB_RETRY, FINISHED, LEASE_LOST, RecoveryPoint};
use crate::error::{IdemError, PhaseError, is_retryable, stored_meanwhile};
use crate::observe::Event;
use crate::response::StoredResponse;
use crate::store::{self, Claimed, Claiming, FenceRecord, NewKeyRecord};

/// How an operation step was interrupted.
#[derive(Debug, thiserror::Error)]
pub enum Interrupted {
    /// The lease was taken over; stop, touch nothing. The new holder answers.
    #[error("the lease on the idempotency key was lost")]
    LeaseLost,
    /// The key was new when this request claimed it, and another request with the same key
    /// stored it first: nothing of this attempt was stored. Claim again to learn what the key
    /// is now (in flight, used for another request, or finished).
    #[error("another request stored the idempotency key first")]
    Superseded,
    /// No automatic retry may finish this operation (the processor's answer cannot be
    /// reconciled with ours); the key is flagged for a person.
    #[error("needs a person: {reason}")]
    NeedsHuman {
        /// Why, for logs and the key's `last_error`; never shown to clients.
        reason: String,
    },
    /// Not a failure: the operation waits for something outside to settle (the processor's
    /// lookups to catch up with its writes) and can say when to look again. The key is released
    /// at its recovery point and due again after `retry_in`; a client is told the same.
    #[error("{detail}")]
    Waiting {
        /// What it waits for, for logs and the key's `last_error`.
        detail: String,
        /// When to look again.
        retry_in: Duration,
    },
    /// Something outside failed in a way that may pass (the processor is unavailable, the
    /// database is away). The key is released at its recovery point.
    #[error("{detail}")]
    Transient {
        /// Which kind of failure.
        kind: TransientKind,
        /// What happened, for logs and the key's `last_error`; never shown to clients.
        detail: String,
    },
}

/// Kinds of transient failure, which the HTTP edge answers differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransientKind {
    /// The card processor could not be reached or failed: `503 processor_unavailable`.
    Processor,
    /// Anything else, such as the database: `500 internal_error`.
    Internal,
}

impl<E: fmt::Display> From<PhaseError<E>> for Interrupted {
    fn from(err: PhaseError<E>) -> Self {
        match err {
            PhaseError::LeaseLost => Self::LeaseLost,
            PhaseError::Superseded => Self::Superseded,
            PhaseError::Database(err) => Self::Transient {
                kind: TransientKind::Internal,
                detail: format!("database: {err}"),
            },
            PhaseError::Operation(err) => {
                Self::Transient { kind: TransientKind::Internal, detail: err.to_string() }
            }
        }
    }
}

impl From<IdemError> for Interrupted {
    fn from(err: IdemError) -> Self {
        match err {
            IdemError::LeaseLost => Self::LeaseLost,
            other => Self::Transient { kind: TransientKind::Internal, detail: other.to_string() },
        }
    }
}

/// A multi-step operation written against the engine. `step` runs from the given recovery
/// point to the next one (or to the final response) and returns; `drive` calls it until the key
/// is finished. The same code serves a request and the completer.
pub trait Operation: Send + Sync {
    /// The operation's recovery points.
    type Point: RecoveryPoint;

    /// Runs the step that starts at `at`: optionally a foreign call (with no transaction open),
    /// then one `lease.phase`.
    fn step(
        &mut self,
        lease: &mut Lease,
        at: Self::Point,
    ) -> impl Future<Output = Result<(), Interrupted>> + Send;
}

/// Drives `operation` from the lease's recovery point to a final response. On a transient
/// failure the key is released at its recovery point and the failure returned; on a lost lease
/// nothing is touched.
pub async fn drive<O: Operation>(
    operation: &mut O,
    mut lease: Lease,
) -> Result<StoredResponse, Interrupted> {
    loop {
        if let Some(response) = lease.finished() {
            return Ok(response.clone());
        }
        let at = match lease.point::<O::Point>() {
            Ok(at) => at,
            Err(err) => {
                let interrupted = Interrupted::from(err);
                lease.release(&interrupted.to_string()).await;
                return Err(interrupted);
            }
        };
        match operation.step(&mut lease, at).await {
            Ok(()) => {
                // Right after a phase committed: the crash tests stop the process here.
                crate::failpoint(|| format!("{}.after_phase.{}", lease.operation, lease.point))
                    .await;
            }
            Err(Interrupted::LeaseLost) => return Err(Interrupted::LeaseLost),
            // Nothing of this attempt was stored: nothing to release.
            Err(Interrupted::Superseded) => return Err(Interrupted::Superseded),
            Err(Interrupted::NeedsHuman { reason }) => {
                lease.flag(&reason).await;
                return Err(Interrupted::NeedsHuman { reason });
            }
            Err(Interrupted::Waiting { detail, retry_in }) => {
                tracing::info!(
                    key_id = lease.key_id,
                    recovery_point = at.name(),
                    retry_in_ms = retry_in.as_millis() as u64,
                    detail,
                    "operation waiting; the key stays at its recovery point"
                );
                lease.release_for(&detail, retry_in).await;
                return Err(Interrupted::Waiting { detail, retry_in });
            }
            Err(transient) => {
                tracing::warn!(key_id = lease.key_id, recovery_point = at.name(), error = %transient, "operation interrupted; the key stays at its recovery point");
                lease.release(&transient.to_string()).await;
                return Err(transient);
            }
        }
    }
}

/// What a phase did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<P> {
    /// Moved the key to this recovery point.
    Next(P),
    /// Moved the key to this recovery point, which makes a foreign call, and froze that call: the
    /// value is stored with the key and handed back by [`Lease::before_call`] to every attempt,
    /// by any process. Also used to stay at a point with a new plan.
    Call(P, Value),
    /// Stored this final response.
    Finish(StoredResponse),
}

/// One atomic phase of an operation: the writes it makes, in one transaction, and where they
/// leave the key. A phase is a value that borrows what it needs (the records an earlier step
/// read, the processor's answer) and is run by [`Lease::phase`], which adds the fence and
/// commits.
///
/// `run` may run more than once (a deadlock runs the phase again), so it only touches the
/// database, never the outside world, and must decide the same way each time.
pub trait Phase: Send {
    /// The operation's recovery points.
    type Point: RecoveryPoint;
    /// The operation's own error.
    type Error: Send;

    /// Makes the phase's writes on `tx` and answers where the key goes next.
    fn run(
        &mut self,
        tx: &mut PgConnection,
    ) -> impl Future<Output = Result<Step<Self::Point>, PhaseError<Self::Error>>> + Send;
}

/// A phase that writes nothing of the operation's own: it only moves the key (to plan a foreign
/// call at a recovery point, say).
impl<P: RecoveryPoint> Phase for Step<P> {
    type Point = P;
    type Error = std::convert::Infallible;

    async fn run(&mut self, _tx: &mut PgConnection) -> Result<Step<P>, PhaseError<Self::Error>> {
        Ok(self.clone())
    }
}

/// A phase lent to [`Lease::phase`], so that the caller can read what it found once it committed
/// (what a log line or a counter should report only for a phase that committed).
impl<F: Phase> Phase for &mut F {
    type Point = F::Point;
    type Error = F::Error;

    fn run(
        &mut self,
        tx: &mut PgConnection,
    ) -> impl Future<Output = Result<Step<Self::Point>, PhaseError<Self::Error>>> + Send {
        (**self).run(tx)
    }
}

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
    /// once, as [`Phase::run`].
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

/// What the first statement of an operation binds to claim its key (`FirstStatement`): its first
/// CTE is `SELECT idem_claim($a, $k, $c, $f) AS claimed`, with these four values in this order.
#[derive(Debug, Clone, Copy)]
pub struct ClaimArgs<'a> {
    /// The key's account.
    pub account: &'a str,
    /// The key.
    pub key: &'a str,
    /// The API key's digest, when the claim checks it.
    pub credential: Option<&'a [u8]>,
    /// The fence: a new key's, which `idem_claim` stores when the key is absent, or a stored
    /// key's, which it moves (fenced on the lease).
    pub fence: &'a FenceRecord,
}

/// An operation's first phase as one statement that also claims its key: for a new key the claim's
/// read and the first phase are one statement and one transaction ([`Engine::claim_first`]); for
/// a key this lease holds already it is the phase ([`Lease::phase_first`]). Like a
/// [`OneStatement`] it commits on its own, its step is decided before it runs, it may run more
/// than once, and it is sent on a kept connection under the same rules.
///
/// [`Engine::claim_first`]: crate::Engine::claim_first
pub trait FirstStatement: Send {
    /// The operation's recovery points.
    type Point: RecoveryPoint;
    /// The operation's own error.
    type Error: Send;
    /// What the statement returns when it stored the key (the rows it wrote).
    type Output: Send;

    /// Where the statement leaves the key.
    fn step(&self) -> Step<Self::Point>;

    /// Sends one statement whose first CTE calls `idem_claim` with `claim`'s values (`SELECT
    /// idem_claim($a, $k, $c, $f) AS claimed`), which makes its writes only from that CTE `WHERE
    /// (claimed).stored`, and returns the `idem_claimed` record it got, unopened, beside its rows
    /// (`None` when it stored nothing: then it wrote nothing).
    fn run(
        &mut self,
        connection: &mut PgConnection,
        claim: ClaimArgs<'_>,
    ) -> impl Future<Output = Result<FirstRun<Self::Output>, PhaseError<Self::Error>>> + Send;
}

/// What a [`FirstStatement`] returns: the `idem_claimed` record, unopened, and the rows it wrote
/// when it stored the key.
pub type FirstRun<T> = (Claimed, Option<T>);

/// An operation whose first phase is a [`FirstStatement`]: a request claims its key with that
/// phase ([`Engine::claim_first`]), so that a new key costs no read of its own.
///
/// [`Engine::claim_first`]: crate::Engine::claim_first
pub trait ClaimsInFirstPhase: Operation {
    /// What the first phase returns.
    type FirstOutput: Send;
    /// The operation's own error.
    type FirstError: Send + fmt::Display;
    /// The first phase.
    type First<'a>: FirstStatement<Point = Self::Point, Output = Self::FirstOutput, Error = Self::FirstError>
    where
        Self: 'a;

    /// The first phase, for a request with id `request_id`.
    fn first<'a>(&'a mut self, request_id: &'a str) -> Self::First<'a>;

    /// The first phase ran in the claim and returned `output`: what `step` needs next.
    fn ran_first(&mut self, output: Self::FirstOutput);
}

/// A first statement run as a phase of a lease that holds its key (stored, or new with an id the
/// claim's read reserved).
struct AsPhase<'a, S> {
    statement: S,
    account: &'a str,
    key: &'a str,
}

impl<S: FirstStatement> OneStatement for AsPhase<'_, S> {
    type Point = S::Point;
    type Error = S::Error;
    type Output = S::Output;

    fn step(&self) -> Step<S::Point> {
        self.statement.step()
    }

    async fn run(
        &mut self,
        connection: &mut PgConnection,
        fence: &FenceRecord,
    ) -> Result<(i64, S::Output), PhaseError<S::Error>> {
        let claim = ClaimArgs { account: self.account, key: self.key, credential: None, fence };
        let (claimed, made) = self.statement.run(connection, claim).await?;
        match claimed.claiming().map_err(corrupt)? {
            Claiming::Stored { id, .. } => Ok((id, made.ok_or_else(|| corrupt(UNMADE))?)),
            // A new key someone else stored first (committed before this statement began).
            Claiming::Read(_) => Err(PhaseError::Superseded),
        }
    }
}

pub(super) const UNMADE: IdemError =
    IdemError::Corrupt("a first statement that stored its key returned no rows");

/// An inconsistency in what the database answered, as a phase's error.
pub(super) fn corrupt<E>(err: IdemError) -> PhaseError<E> {
    PhaseError::Database(sqlx::Error::Protocol(err.to_string()))
}

impl Lease {
    /// Runs one atomic phase: one transaction that does the phase's writes and moves the key to
    /// the next recovery point or stores the final response, fenced on this lease. If the fence
    /// refuses, or anything fails, the whole phase rolls back. Serialization failures and
    /// deadlocks run the phase again.
    ///
    /// The first phase of a new key also stores the key, first in the same transaction (so that
    /// the phase may write rows that refer to it): if another request stored the same key first,
    /// the insert waits for it on the unique index, the phase rolls back and fails with
    /// [`PhaseError::Superseded`].
    pub async fn phase<F: Phase>(
        &mut self,
        mut phase: F,
    ) -> Result<Step<F::Point>, PhaseError<F::Error>> {
        let engine = self.engine.clone();
        let _granting = engine.granting_new(self.new.is_some())?;
        let span = self.phase_span();
        let mut tries = 0;
        loop {
            let attempt = self.phase_once(&mut phase).instrument(span.clone()).await;
            if let Some(settled) = self.settle(attempt, &span, &mut tries).await {
                return settled.map(|(step, ())| step);
            }
        }
    }

    async fn phase_once<F: Phase>(
        &self,
        phase: &mut F,
    ) -> Result<(Step<F::Point>, ()), PhaseError<F::Error>> {
        if self.finished.is_some() {
            return Err(PhaseError::LeaseLost);
        }
        let mut tx = self.engine.pool.begin().await?;
        // A new key is stored first, holding the lease at its recovery point: a request with the
        // same key waits on the unique index before it writes anything, and the phase may write
        // rows that refer to the key. Dropping the transaction on an error rolls back everything.
        if self.new.is_some() {
            let store_new = self.fence_to(&self.point, None, None, true)?;
            store::commit(&mut *tx, &store_new).await.map_err(|err| self.fence_error(err))?;
        }
        let step = phase.run(&mut tx).await?;
        // The key is stored now (by this phase or an earlier one): its move is a typed, fenced
        // statement, with no JSON fence to build or parse.
        let fence = self.fence();
        let moved = match &step {
            Step::Next(next) => store::advance(&mut *tx, &fence, next.name(), None).await,
            Step::Call(next, plan) => {
                store::advance(&mut *tx, &fence, next.name(), Some(plan)).await
            }
            Step::Finish(response) => store::finish(&mut *tx, &fence, response).await,
        };
        if moved.map_err(|err| self.fence_error(err))?.is_none() {
            return Err(PhaseError::LeaseLost);
        }
        tx.commit().await?;
        Ok((step, ()))
    }

    /// Runs one atomic phase as a single statement, which commits on its own, and answers what
    /// the statement returned. Otherwise as [`Lease::phase`]: the statement may run more than
    /// once, and a new key is stored by it.
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

    /// Runs an operation's first phase, as one statement, for a key this lease holds: a key stored
    /// before (by a release that stored keys when it claimed them), or a new one whose id the claim's
    /// read reserved. Otherwise as [`Lease::phase_in_one`].
    pub async fn phase_first<S: FirstStatement>(
        &mut self,
        statement: S,
    ) -> Result<S::Output, PhaseError<S::Error>> {
        let (account, key) = match &self.new {
            Some(new) => (new.account_id.clone(), new.key.clone()),
            None => (String::new(), String::new()),
        };
        self.phase_in_one(AsPhase { statement, account: &account, key: &key }).await
    }

    /// Sends the statement once: in a batch when it is batched and the batch took it, else on a
    /// kept connection (`kept.rs`) or a pooled one.
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

    pub(super) fn phase_span(&self) -> tracing::Span {
        tracing::info_span!("idem.phase", key_id = self.key_id, from = %self.point, to = tracing::field::Empty)
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

    /// After a phase that ends with `step` committed: the lease is at its new point.
    pub(super) fn moved<P: RecoveryPoint>(&mut self, step: &Step<P>, span: &tracing::Span) {
        self.just_planned = None;
        match step {
            Step::Next(point) => {
                span.record("to", point.name());
                self.point = point.name().to_owned();
            }
            Step::Call(point, plan) => {
                span.record("to", point.name());
                self.point = point.name().to_owned();
                self.just_planned = Some(plan.clone());
            }
            Step::Finish(response) => {
                span.record("to", FINISHED);
                self.point = FINISHED.to_owned();
                self.finished = Some(response.clone());
                self.engine.observer.event(Event::Finished);
            }
        }
    }

    /// After a commit that may have stored a new key: the key is stored from now on. The database
    /// granted the lease with it, so a process stopping meanwhile gives it back at once.
    pub(super) async fn stored<E>(&mut self) -> Result<(), PhaseError<E>> {
        if self.new.take().is_none() {
            return Ok(());
        }
        // The hang-up tests stall here: a caller that goes away from now on must not take the
        // lease with it.
        crate::failpoint(|| "idem.claim.inserted".to_owned()).await;
        if self.finished.is_none() && self.engine.is_closed() {
            self.engine.give_back(self.key_id, self.token, "the server was stopping").await;
            return Err(PhaseError::LeaseLost);
        }
        Ok(())
    }

    /// The fence that ends a phase with `step` (`idem_commit_fence`, see its migration); with
    /// `store_new`, it inserts the new key rather than moving a stored one.
    pub(super) fn fence_of<P: RecoveryPoint>(
        &self,
        step: &Step<P>,
        store_new: bool,
    ) -> Result<FenceRecord, sqlx::Error> {
        match step {
            Step::Next(next) => self.fence_to(next.name(), None, None, store_new),
            Step::Call(next, plan) => self.fence_to(next.name(), Some(plan), None, store_new),
            Step::Finish(response) => self.fence_to(FINISHED, None, Some(response), store_new),
        }
    }

    pub(super) fn fence_to(
        &self,
        next: &str,
        plan: Option<&Value>,
        response: Option<&StoredResponse>,
        store_new: bool,
    ) -> Result<FenceRecord, sqlx::Error> {
        let new = self.new.as_ref().filter(|_| store_new).map(|new| NewKeyRecord {
            account_id: &new.account_id,
            key: &new.key,
            fingerprint: new.fingerprint.as_bytes(),
            method: &new.method,
            path: &new.path,
            request_id: &self.request_id,
            operation: &self.operation,
            params: &self.params,
        });
        FenceRecord::new(&self.fence(), next, plan, response, new)
    }

    /// What fences this lease's moves: the key, the token, the recovery point it holds the key
    /// at, and how long a renewed lease lasts.
    fn fence(&self) -> store::Fence<'_> {
        store::Fence {
            key_id: self.key_id,
            token: self.token,
            expected: &self.point,
            lease_ms: self.engine.config.lease_ms(),
        }
    }

    /// What a failure of the fence means: the lease is lost (`IL001`), the new key was stored by
    /// another request first (a unique violation on the key), or a database error.
    pub(super) fn fence_error<E>(&self, err: sqlx::Error) -> PhaseError<E> {
        let Some(db) = err.as_database_error() else { return PhaseError::Database(err) };
        match db.code().as_deref() {
            Some(LEASE_LOST) => PhaseError::LeaseLost,
            _ if self.new.is_some() && stored_meanwhile(&err) => PhaseError::Superseded,
            _ => PhaseError::Database(err),
        }
    }
}
