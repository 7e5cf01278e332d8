//! The lease a claim grants: what the holder may read of its key, and what it does besides
//! phases (check the lease before a foreign call, flag the key, give it back).

use std::fmt;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::drive::Interrupted;
use super::give_back::{GiveBack, Holding};
use super::{Engine, RecoveryPoint, Request};
use crate::error::{IdemError, PhaseError};
use crate::observe::Event;
use crate::response::StoredResponse;
use crate::store;

/// The right to run an operation's next phase, held by exactly one process at a time.
///
/// Every phase commit is fenced on this lease's token and the recovery point it expects, so a
/// holder that lost the lease (it was too slow, and another process took the key over) can never
/// commit anything.
pub struct Lease {
    pub(super) engine: Engine,
    pub(super) key_id: i64,
    pub(super) token: Uuid,
    pub(super) point: String,
    pub(super) attempts: i32,
    pub(super) operation: String,
    pub(super) params: Value,
    pub(super) request_id: String,
    pub(super) finished: Option<StoredResponse>,
    /// The call this lease's own last phase planned, committed a moment ago: its first attempt
    /// needs no fenced check of its own (`before_call`).
    pub(super) just_planned: Option<Value>,
    /// Set while the key is new and not stored yet: what its first phase inserts with its
    /// writes. No one else can see the key until then.
    pub(super) new: Option<Box<Request>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.engine.forget(self.key_id, self.token);
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key_id", &self.key_id)
            .field("point", &self.point)
            .field("attempts", &self.attempts)
            .field("operation", &self.operation)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The key's row id; local records created by the operation may refer to it.
    pub fn key_id(&self) -> i64 {
        self.key_id
    }

    /// The operation's name.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The operation's input, as the first request stored it.
    pub fn params(&self) -> &Value {
        &self.params
    }

    /// The first request's id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// How many times the key has been claimed (1 for a new key).
    pub fn attempts(&self) -> i32 {
        self.attempts
    }

    /// The recovery point the key is at, as the operation's enum. An unknown name is an error.
    pub fn point<P: RecoveryPoint>(&self) -> Result<P, IdemError> {
        P::from_name(&self.point).ok_or_else(|| IdemError::UnknownRecoveryPoint(self.point.clone()))
    }

    /// The final response, once a phase stored it.
    pub fn finished(&self) -> Option<&StoredResponse> {
        self.finished.as_ref()
    }

    /// Before anything but a phase acts on a new key: stores it at its recovery point, holding
    /// the lease, in a statement of its own, so that the key is in flight for everyone before
    /// anything happens outside.
    pub(super) async fn store_new(&mut self) -> Result<(), Interrupted> {
        if self.new.is_none() {
            return Ok(());
        }
        let engine = self.engine.clone();
        let _granting = engine
            .granting_new(true)
            .map_err(|err: PhaseError<IdemError>| Interrupted::from(err))?;
        let fence = self
            .fence_to(&self.point, None, None, true)
            .map_err(|err| Interrupted::from(PhaseError::<IdemError>::Database(err)))?;
        let stored = self
            .engine
            .retrying(|| async {
                match store::commit(&self.engine.pool, &fence).await {
                    Ok(_) => Ok(Ok(())),
                    Err(err) => match self.fence_error::<IdemError>(err) {
                        PhaseError::Database(err) => Err(IdemError::Database(err)),
                        other => Ok(Err(Interrupted::from(other))),
                    },
                }
            })
            .await?;
        stored?;
        self.stored().await.map_err(Interrupted::from)
    }

    /// Right before a foreign call: makes sure this lease still holds the key at its recovery
    /// point (fenced, so a holder that lost the key stops here, before acting outside) and
    /// extends the lease; answers the call planned at the point (`None` at a point where no call
    /// was planned). Right after this lease's own phase planned the call, that commit was the
    /// check, and no round trip is made.
    pub async fn before_call(&mut self) -> Result<Option<Value>, Interrupted> {
        // Not when the process is stopping: `release_held` may have given the lease back since.
        if let Some(plan) = self.just_planned.take()
            && !self.engine.is_closed()
        {
            // As stored: a JSON null plan is no plan (`FenceRecord`), for this holder too.
            return Ok(Some(plan).filter(|plan| !plan.is_null()));
        }
        self.store_new().await?;
        let lease_ms = self.engine.config.lease_ms();
        let checked = self
            .engine
            .retrying(|| async {
                Ok(store::before_call(
                    &self.engine.pool,
                    self.key_id,
                    self.token,
                    &self.point,
                    lease_ms,
                )
                .await?)
            })
            .await?;
        match checked {
            Some(plan) => Ok(plan),
            None => {
                self.engine.observer.event(Event::LeaseLost);
                tracing::warn!(key_id = self.key_id, recovery_point = %self.point, "lease lost before a foreign call: not calling");
                Err(Interrupted::LeaseLost)
            }
        }
    }

    /// Before a foreign call that is not the planned one (a lookup at the processor): makes sure,
    /// fenced, that this lease still holds the key at its recovery point, and extends it, so that
    /// each foreign call starts with a whole lease ahead of it. A new key not stored yet is
    /// stored first, at its recovery point ([`Interrupted::Superseded`] if another request stored
    /// it first), as before any foreign call.
    pub async fn renew(&mut self) -> Result<(), Interrupted> {
        self.just_planned = None;
        self.before_call().await.map(|_| ())
    }

    /// For an operation that cannot learn what its planned call did, and found nothing where
    /// the call's object would be: marks the outcome unresolved (the first time) and answers for
    /// how long it has been, by the database clock. Anything the call made was made before the
    /// first such answer, so once this outlives the call and the lookup's lag, "nothing" is the
    /// truth. A new plan (the next generation) clears the mark. Fenced (a key not stored yet, which
    /// made no call, reads as a lost lease).
    pub async fn unresolved_for(&self) -> Result<Duration, Interrupted> {
        let seconds = self
            .engine
            .retrying(|| async {
                Ok(store::unresolved_for(&self.engine.pool, self.key_id, self.token).await?)
            })
            .await?
            .ok_or(Interrupted::LeaseLost)?;
        Ok(Duration::from_secs_f64(seconds.max(0.0)))
    }

    /// Flags the key for a person: no one drives it automatically again. Fenced on this lease.
    pub async fn flag(mut self, reason: &str) {
        if self.store_new().await.is_err() {
            // Stored by another request first, or not at all: not ours to flag.
            return;
        }
        match store::flag(&self.engine.pool, self.key_id, self.token, reason).await {
            Ok(true) => {
                self.engine.observer.event(Event::Flagged);
                tracing::error!(key_id = self.key_id, recovery_point = %self.point, reason, "an idempotency key needs a person");
            }
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(key_id = self.key_id, error = %err, "could not flag an idempotency key; it is retried after its lease")
            }
        }
    }

    /// Gives the key back to be driven again after `retry_in`, not sooner (see
    /// `Interrupted::Waiting`). Answers `Some(false)` when the key was not this lease's any more
    /// (taken over), `None` when the database could not be asked: the give-back then goes on in
    /// the background, on connections of its own (`give_back.rs`).
    pub async fn release_for(self, reason: &str, retry_in: Duration) -> Option<bool> {
        let holding = Holding::Stored { key_id: self.key_id };
        let back = GiveBack { holding, token: self.token, reason: reason.to_owned(), retry_in };
        self.engine.give_back(back, false).await
    }

    /// Gives the key back after a transient failure: it stays at its recovery point, unlocked, so
    /// that a retry with the same key resumes at once and the completer after a back-off. Answers
    /// as [`Lease::release_for`].
    pub async fn release(self, reason: &str) -> Option<bool> {
        let delay = self.engine.config.retry_delay(self.attempts);
        self.release_for(reason, delay).await
    }
}
