//! Writing an operation against the engine: the [`Operation`] trait, how a step is interrupted
//! ([`Interrupted`]), and the loop that drives it from its recovery point to its end ([`drive`]):
//! Leach's `loop { case key.recovery_point … }`.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::claim::{Claim, Request};
use super::lease::Lease;
use super::{DB_RETRY, Engine, RecoveryPoint};
use crate::error::{IdemError, PhaseError};
use crate::observe::Event;
use crate::response::StoredResponse;

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
    /// The database refused a phase for a conflict with another transaction (a serialization
    /// failure, a deadlock): nothing of it was written, and [`drive`] runs
    /// the step again, a bounded number of times, before it gives up as `Internal` would.
    Conflict,
}

impl<E: fmt::Display> From<PhaseError<E>> for Interrupted {
    fn from(err: PhaseError<E>) -> Self {
        match err {
            PhaseError::LeaseLost => Self::LeaseLost,
            PhaseError::Superseded => Self::Superseded,
            // A phase sent as one statement has had its retries already (`Lease::phase_in_one`):
            // what is left is a failure, not a conflict for `drive` to run again.
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
    /// then one phase (`lease.begin()` … `tx.commit_…`). A step may run again from the same
    /// point (after a conflict in its phase, a crash, a release), so it decides the same way
    /// each time, and its foreign call is the frozen one, under the same downstream key.
    fn step(
        &mut self,
        lease: &mut Lease,
        at: Self::Point,
    ) -> impl Future<Output = Result<(), Interrupted>> + Send;

    /// Claims the key for `request`, to be driven from where it is: by a read, and a takeover
    /// when the key is free ([`Engine::claim`]). An operation on the fast path may claim it in
    /// its first phase instead ([`Engine::claim_first`]), keep what that phase wrote for its next
    /// step, and say so with [`Operation::claims_in_first_phase`].
    fn claim(
        &mut self,
        engine: &Engine,
        request: &Request,
    ) -> impl Future<Output = Result<Claim, IdemError>> + Send {
        engine.claim(request)
    }

    /// Whether [`Operation::claim`] writes before it decides (the fast path's first phase): then
    /// a caller asks only the answers kept in memory before it claims where a hang-up cannot cut
    /// the claim off. Otherwise it may read the claim first where it can be cut off
    /// ([`Engine::read_claim`], which writes nothing) and take the key it found open
    /// ([`Engine::take`]) where it cannot: a replay, a refusal cost no task of their own.
    fn claims_in_first_phase(&self) -> bool {
        false
    }
}

/// Drives `operation` from the lease's recovery point to a final response. A step whose phase
/// conflicted with another transaction runs again from where the key is; on any other transient
/// failure the key is released at its recovery point and the failure returned; on a lost lease
/// nothing is touched.
pub async fn drive<O: Operation>(
    operation: &mut O,
    mut lease: Lease,
) -> Result<StoredResponse, Interrupted> {
    let mut conflicts = 0;
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
                // Each step has the whole budget of reruns after a conflict.
                conflicts = 0;
                // Right after a phase committed: the crash tests stop the process here.
                crate::failpoint(|| format!("{}.after_phase.{}", lease.operation, lease.point))
                    .await;
            }
            Err(Interrupted::Transient { kind: TransientKind::Conflict, .. })
                if conflicts < lease.engine.config.db_retries =>
            {
                conflicts += 1;
                lease.engine.observer.event(Event::DatabaseRetry);
                tokio::time::sleep(DB_RETRY.delay(conflicts)).await;
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
                // A phase's writes run before its fence: a holder that lost a stored key can fail
                // on them (a row the new holder wrote) before the fence would have told it. The
                // key not being ours to give back says which it was. (A new key that was never
                // stored is not ours to give back either, and its failure is its own.)
                let stored = lease.new.is_none();
                let (engine, key_id) = (lease.engine.clone(), lease.key_id);
                if lease.release(&transient.to_string()).await == Some(false) && stored {
                    engine.observer.event(Event::LeaseLost);
                    tracing::warn!(
                        key_id,
                        "lease lost: the key was taken over while this step ran"
                    );
                    return Err(Interrupted::LeaseLost);
                }
                return Err(transient);
            }
        }
    }
}
