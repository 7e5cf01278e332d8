//! An atomic phase: one database transaction, fenced on the lease. The operation makes its writes
//! on it with plain functions over `&mut PgConnection`, and ends it with one of three commits,
//! each of which moves the key in the same transaction:
//!
//! ```text
//! let mut tx = lease.begin().await?;                 // BEGIN, the key held (a new key: inserted)
//! insert_refund(&mut tx, …).await?;                  // the operation's own writes
//! tx.commit_call(Point::RefundCreated, &request)     // or commit_next(point), commit_answer(response)
//! ```
//!
//! Each commit is fenced: it moves the key only `WHERE owner_token = ours AND recovery_point =
//! where we started`, and if that moves no row the whole transaction rolls back
//! ([`Interrupted::LeaseLost`]). A transaction dropped without a commit rolls back too, so an
//! error anywhere in a phase leaves nothing behind. The phase holds its key's row from its first
//! statement (`store::begin_holding`), so a phase that waits for a lock past its lease is not
//! taken over meanwhile: the takeover waits for the phase (up to its claim timeout, then `503`)
//! and then finds the key moved on.

use std::ops::{Deref, DerefMut};

use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, Postgres, Transaction};
use tracing::Instrument;

use super::held_leases::Granting;
use super::lease::Lease;
use super::{FINISHED, Interrupted, LEASE_LOST, RecoveryPoint, TransientKind};
use crate::error::{IdemError, PhaseError, conflicted, stored_meanwhile};
use crate::observe::Event;
use crate::response::StoredResponse;
use crate::store::{self, FenceRecord, NewKeyRecord};

/// Where a phase leaves the key.
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

/// A phase's transaction, fenced on the lease that began it ([`Lease::begin`]). It dereferences
/// to the connection, so the operation's writes are plain functions over `&mut PgConnection`
/// called with `&mut tx`.
pub struct FencedTx<'l> {
    lease: &'l mut Lease,
    tx: Transaction<'static, Postgres>,
    /// For a new key: counted as a lease on its way until the commit stores it.
    _granting: Option<Granting>,
    span: tracing::Span,
}

impl Deref for FencedTx<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for FencedTx<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl std::fmt::Debug for FencedTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTx").field("lease", &self.lease).finish_non_exhaustive()
    }
}

impl Lease {
    /// Begins an atomic phase. A stored key's row is held from here to the commit
    /// (`store::begin_holding`). A new key is stored first, in the same transaction, holding the
    /// lease at its recovery point: a request with the same key then waits on the unique index
    /// before it writes anything, and the phase may write rows that refer to the key. If another
    /// request stored the key first, this fails with [`Interrupted::Superseded`].
    pub async fn begin(&mut self) -> Result<FencedTx<'_>, Interrupted> {
        let span = self.phase_span();
        if self.finished.is_some() {
            return Err(self.failed(PhaseError::LeaseLost, &span));
        }
        let granting = match self.engine.granting_new::<Interrupted>(self.new.is_some()) {
            Ok(granting) => granting,
            Err(err) => return Err(self.failed(err, &span)),
        };
        let begin = match self.new {
            None => store::begin_holding(self.key_id, self.token).into(),
            Some(_) => std::borrow::Cow::Borrowed("BEGIN"),
        };
        let mut tx = self.engine.pool.begin_with(begin).instrument(span.clone()).await?;
        if self.new.is_some() {
            let store_new = self.fence_to(&self.point, None, None, true)?;
            let stored = store::commit(&mut *tx, &store_new).instrument(span.clone()).await;
            if let Err(err) = stored {
                return Err(self.failed(self.fence_error(err), &span));
            }
        }
        Ok(FencedTx { lease: self, tx, _granting: granting, span })
    }

    /// What a phase that failed at its fence comes to, reported: a lost lease, a new key another
    /// request stored first, or a database error (a conflict among them runs the step again).
    fn failed(&self, err: PhaseError<Interrupted>, span: &tracing::Span) -> Interrupted {
        match err {
            PhaseError::LeaseLost => {
                self.engine.observer.event(Event::LeaseLost);
                tracing::warn!(parent: span, "lease lost: the phase was rolled back");
                Interrupted::LeaseLost
            }
            PhaseError::Superseded => {
                // Not counted here: the claim that follows counts what the key turned out to be.
                tracing::debug!(parent: span, "another request stored the new key first: the phase was rolled back");
                Interrupted::Superseded
            }
            PhaseError::Database(err) => Interrupted::from(err),
            PhaseError::Operation(interrupted) => interrupted,
        }
    }
}

impl FencedTx<'_> {
    /// Commits the phase and moves the key to `next`.
    pub async fn commit_next<P: RecoveryPoint>(self, next: P) -> Result<(), Interrupted> {
        self.commit(Step::Next(next)).await
    }

    /// Commits the phase and moves the key to `next`, freezing there the foreign call `call`
    /// makes: every attempt from that point, by any process, sends exactly this.
    pub async fn commit_call<P: RecoveryPoint>(
        self,
        next: P,
        call: &impl Serialize,
    ) -> Result<(), Interrupted> {
        let plan = serde_json::to_value(call).map_err(|err| Interrupted::Transient {
            kind: TransientKind::Internal,
            detail: format!("the planned call does not serialize: {err}"),
        })?;
        self.commit(Step::Call(next, plan)).await
    }

    /// Commits the phase and stores `answer` as the key's final response.
    pub async fn commit_answer(self, answer: StoredResponse) -> Result<(), Interrupted> {
        self.commit(Step::Finish::<FinishedPoint>(answer)).await
    }

    /// Moves the key as `step` says, fenced, then commits; rolls everything back when the fence
    /// refuses.
    async fn commit<P: RecoveryPoint>(self, step: Step<P>) -> Result<(), Interrupted> {
        let FencedTx { lease, mut tx, _granting, span } = self;
        let moved = async {
            // The key is stored now (by this phase or an earlier one): its move is a typed,
            // fenced statement.
            let fence = lease.fence();
            let moved = match &step {
                Step::Next(next) => store::advance(&mut *tx, &fence, next.name(), None).await,
                Step::Call(next, plan) => {
                    store::advance(&mut *tx, &fence, next.name(), Some(plan)).await
                }
                Step::Finish(response) => store::finish(&mut *tx, &fence, response).await,
            };
            if moved.map_err(|err| lease.fence_error::<Interrupted>(err))?.is_none() {
                return Err(PhaseError::LeaseLost);
            }
            tx.commit().await.map_err(|err| lease.fence_error(err))
        }
        .instrument(span.clone())
        .await;
        if let Err(err) = moved {
            return Err(lease.failed(err, &span));
        }
        lease.moved(&step, &span);
        lease.stored().await.map_err(Interrupted::from)
    }
}

/// The point type of a phase that stores the final answer: the answer names no point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FinishedPoint;

impl RecoveryPoint for FinishedPoint {
    fn name(self) -> &'static str {
        FINISHED
    }

    fn from_name(_: &str) -> Option<Self> {
        None
    }
}

impl From<sqlx::Error> for Interrupted {
    /// A database error in a phase: a conflict with another transaction (a serialization
    /// failure, a deadlock) is one `drive` runs the step again for.
    fn from(err: sqlx::Error) -> Self {
        let kind = if conflicted(&err) { TransientKind::Conflict } else { TransientKind::Internal };
        Interrupted::Transient { kind, detail: format!("database: {err}") }
    }
}

impl Lease {
    pub(super) fn phase_span(&self) -> tracing::Span {
        tracing::info_span!("idem.phase", key_id = self.key_id, from = %self.point, to = tracing::field::Empty)
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
    pub(super) async fn stored(&mut self) -> Result<(), IdemError> {
        if self.new.take().is_none() {
            return Ok(());
        }
        // A caller that goes away from now on must not take the lease with it.
        crate::failpoint(|| "idem.claim.inserted".to_owned()).await;
        if self.finished.is_none() && self.engine.is_closed() {
            self.engine.release_now(self.key_id, self.token, "the server was stopping").await;
            return Err(IdemError::LeaseLost);
        }
        Ok(())
    }

    /// The fence that ends a phase with `step` (`idem_commit_fence`, see docs/schema.sql); with
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
            key: new.key.as_str(),
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
    pub(super) fn fence(&self) -> store::Fence<'_> {
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
