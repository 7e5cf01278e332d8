//! The runner: a request's claim read on its own task, then the key taken, the operation driven
//! and its answer on a task that outlives the request; and how each outcome is answered.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use idem::{
    Claim, Engine, IdempotencyKey, Interrupted, Operation, Read, StoredResponse, TransientKind,
};
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::auth::invalid_api_key;
use crate::error::{ApiError, ProblemCode};

use super::IDEMPOTENT_REPLAYED;

/// Runs idempotent operations: the engine plus the tasks that outlive their requests.
#[derive(Debug, Clone)]
pub struct Runner {
    engine: Engine,
    tasks: TaskTracker,
}

impl Runner {
    /// A runner over the engine; `tasks` is waited for on shutdown.
    pub fn new(engine: Engine, tasks: TaskTracker) -> Self {
        Self { engine, tasks }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Claims the key and answers: a replay, a refusal, or the operation's own answer. What
    /// decides without writing runs on the request's own task, where a client that hangs up cuts
    /// it off and leaves nothing behind, and a replay or a refusal needs no task of its own: the
    /// claim's read ([`Engine::read_claim`]), or for an operation that claims its key in its
    /// first phase, which writes, the answers kept in memory. Taking the key
    /// ([`Operation::claim`], or [`Engine::take`] of the key the read found open) and driving the
    /// operation run on a task that outlives the request, which owns a copy of the request.
    pub async fn run<O: Operation + 'static>(
        &self,
        request: idem::Request,
        operation: O,
    ) -> Result<Response, ApiError> {
        let (stored, replayed) = self.answer(request, operation).await?;
        Ok(stored_response(stored, replayed))
    }

    /// What [`run`](Self::run) answers, as the stored answer and whether it is a replay, for a
    /// handler that sends it otherwise than as stored (an endpoint's creation opens its sealed
    /// secret).
    pub async fn answer<O: Operation + 'static>(
        &self,
        request: idem::Request,
        mut operation: O,
    ) -> Result<(StoredResponse, bool), ApiError> {
        let mut open = None;
        if operation.claims_in_first_phase() {
            if let Some(claim) = self.engine.cached_answer(&request).await {
                return claimed(claim, &request.key);
            }
        } else {
            match self.engine.read_claim(&request).await {
                Ok(Read::Decided(claim)) => return claimed(claim, &request.key),
                Ok(Read::Open(read)) => open = Some(read),
                Err(err) if err.timed_out() => return Err(claim_timed_out()),
                Err(err) => return Err(ApiError::internal(&err)),
            }
        }
        let key = request.key.clone();
        let engine = self.engine.clone();
        let task = self.tasks.spawn(
            async move {
                // A new key's first phase can find that another request stored the key first;
                // claiming again then reads it (stored now, so at most once more).
                for _ in 0..2 {
                    let taken = match open.take() {
                        Some(open) => engine.take(open, &request).await?,
                        None => None,
                    };
                    // Not taken (taken by another request between the read and the take, or
                    // not read yet): claim it.
                    let claim = match taken {
                        Some(claim) => claim,
                        None => operation.claim(&engine, &request).await?,
                    };
                    let lease = match claim {
                        Claim::Acquired(lease) => lease,
                        other => return Ok(Ran::Claimed(other)),
                    };
                    match idem::drive(&mut operation, lease).await {
                        Err(Interrupted::Superseded) => {}
                        driven => return Ok(Ran::Driven(driven)),
                    }
                }
                Err(idem::IdemError::Contended)
            }
            .in_current_span(),
        );
        answered(task.await, &key)
    }
}

/// The answer to what a request's task did, and whether it is a replay.
fn answered(
    task: Result<Result<Ran, idem::IdemError>, tokio::task::JoinError>,
    key: &IdempotencyKey,
) -> Result<(StoredResponse, bool), ApiError> {
    match task {
        Ok(Ok(Ran::Driven(Ok(stored)))) => Ok((stored, false)),
        Ok(Ok(Ran::Driven(Err(interrupted)))) => Err(interrupted_error(interrupted)),
        Ok(Ok(Ran::Claimed(claim))) => claimed(claim, key),
        // Other requests kept taking the key and giving it back: it is in use, and a retry with
        // the same key gets its answer, as the 409's `Retry-After` promises.
        Ok(Err(idem::IdemError::Contended)) => Err(in_use()),
        // Another process holds the key now (or this one began to stop as it stored it): the
        // holder answers, and a retry gets its answer.
        Ok(Err(idem::IdemError::LeaseLost)) => Err(in_use()),
        Ok(Err(err)) if err.timed_out() => Err(claim_timed_out()),
        Ok(Err(err)) => Err(ApiError::internal(&err)),
        Err(join_error) => Err(ApiError::internal(&join_error)),
    }
}

/// The answer to a claim decided without a lease (a replay, or a refusal).
fn claimed(claim: Claim, key: &IdempotencyKey) -> Result<(StoredResponse, bool), ApiError> {
    match claim {
        // A lease is driven on the operation's task, never answered here.
        Claim::Acquired(_) => {
            Err(ApiError::internal(&std::io::Error::other("a claimed lease came back undriven")))
        }
        Claim::Replay(stored) => Ok((stored, true)),
        Claim::InUse => Err(in_use()),
        Claim::Mismatch { method, path } => Err(ApiError::new(
            ProblemCode::IdempotencyKeyReused,
            format!(
                "The key '{key}' was first used for {method} {path} with different parameters."
            ),
        )),
        Claim::Unauthenticated => Err(invalid_api_key()),
        Claim::NeedsHuman => Err(needs_review()),
    }
}

/// What the task of a request did.
#[allow(clippy::large_enum_variant)] // one per request, matched at once; a box would allocate
enum Ran {
    /// It held the key and drove the operation.
    Driven(Result<StoredResponse, Interrupted>),
    /// The claim answered without a lease.
    Claimed(Claim),
}

/// `503 service_unavailable`: the claim gave up waiting (for a claim connection, or for the key's
/// row held by another transaction); nothing was stored.
fn claim_timed_out() -> ApiError {
    ApiError::new(
        ProblemCode::ServiceUnavailable,
        "The server could not take up this request in time. Nothing was stored; retry with the same Idempotency-Key.",
    )
}

fn in_use() -> ApiError {
    ApiError::new(
        ProblemCode::IdempotencyKeyInUse,
        "A request with this Idempotency-Key is still being processed. Retry after a moment with the same key to receive its answer.",
    )
}

/// A key no automatic retry may drive: final for the client, so no `Retry-After`.
fn needs_review() -> ApiError {
    ApiError::new(
        ProblemCode::OperationNeedsReview,
        "The operation with this Idempotency-Key cannot be finished automatically and was referred to an operator. Do not retry it, under this key or another: read the object to see where it stands.",
    )
}

fn interrupted_error(interrupted: Interrupted) -> ApiError {
    match interrupted {
        Interrupted::NeedsHuman { .. } => needs_review(),
        // Another process took the key over and will answer; a retry gets its answer.
        Interrupted::LeaseLost => in_use(),
        // Claimed again by the runner; should it come this far, the key is in flight elsewhere.
        Interrupted::Superseded => in_use(),
        // At most five minutes: a promise a client can keep without giving up.
        Interrupted::Waiting { retry_in, .. } => ApiError::new(
            ProblemCode::ProcessorUnavailable,
            "The card processor cannot yet show what happened to this operation. Retry with the same Idempotency-Key after Retry-After; the operation resumes where it stopped and is never performed twice.",
        )
        .with_retry_after(retry_in.as_secs_f64().ceil().clamp(1.0, 300.0) as u32),
        Interrupted::Transient { kind: TransientKind::Processor, .. } => ApiError::new(
            ProblemCode::ProcessorUnavailable,
            "The card processor could not be reached. Retry with the same Idempotency-Key; the operation resumes where it stopped.",
        ),
        // A conflict that outlasted `drive`'s retries is a database failure like any other.
        Interrupted::Transient {
            kind: TransientKind::Internal | TransientKind::Conflict,
            detail,
        } => {
            ApiError::internal(&std::io::Error::other(detail))
        }
    }
}

/// A stored answer as an HTTP response, marked when it is a replay.
pub fn stored_response(stored: StoredResponse, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            headers.insert(name, value);
        }
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED.clone(), HeaderValue::from_static("true"));
    }
    response
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lost_while_claiming_is_in_use_not_a_server_error() {
        let key = IdempotencyKey::parse(b"k-lost").unwrap();
        let answer = answered(Ok(Err(idem::IdemError::LeaseLost)), &key).unwrap_err();
        assert_eq!(answer.code(), ProblemCode::IdempotencyKeyInUse);
    }

    #[test]
    fn a_key_other_requests_keep_taking_is_in_use_not_a_server_error() {
        let key = IdempotencyKey::parse(b"k-contended").unwrap();
        let answer = answered(Ok(Err(idem::IdemError::Contended)), &key).unwrap_err();
        assert_eq!(answer.code(), ProblemCode::IdempotencyKeyInUse);
        let response = answer.render("req_test", "http://localhost");
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert!(response.headers().contains_key(axum::http::header::RETRY_AFTER));
    }
}
