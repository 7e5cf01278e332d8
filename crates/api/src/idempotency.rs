//! The HTTP side of the idempotency engine: what every money-moving handler goes through.
//!
//! `IdempotentPost` takes a money-moving POST apart in the contract's order; `RequiredKey` parses
//! the `Idempotency-Key` header (400 when missing or malformed). `Runner::run`
//! fingerprints the request and reads the key's claim, which either replays the stored answer
//! (with `Idempotent-Replayed: true`), refuses (409 with `Retry-After`, 422), or finds the key open
//! to this request; then, on a task of its own, it takes the key and runs the operation. axum
//! drops a handler's future when the client hangs up: the claim's read writes nothing, so it may
//! be cut off, but a takeover cut off after the database granted its lease would leave the key
//! leased to nobody until the lease expired, and an operation cut off halfway likewise. The task
//! takes the key, and finishes the phase it is in, whatever the client does; graceful shutdown
//! waits for it, and gives back at their recovery points the leases of tasks it cannot wait for.
//! `Runner::run_first` is the same for an operation whose first phase claims its key (a new
//! payment): only a replay kept in memory is answered on the request's task; the claim, which
//! may store the key with the phase's writes, runs on the operation's.

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use idem::{
    Claim, ClaimsInFirstPhase, Engine, Fingerprint, First, IdempotencyKey, Interrupted, Operation,
    PhaseError, Read, RequestParts, StoredResponse, TransientKind,
};
use payments_domain::AccountId;
use payments_domain::operations::PaymentOperation;
use provider::ProcessorClient;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::app::AppState;
use crate::auth::{Caller, invalid_api_key};
use crate::edge::RequestId;
use crate::error::{ApiError, ProblemCode};
use crate::extract::JsonBody;

/// An operation a handler starts: one the completer can resume, with the API's processor.
pub trait StartedOperation: PaymentOperation<ProcessorClient> + 'static {}

impl<O: PaymentOperation<ProcessorClient> + 'static> StartedOperation for O {}

/// The header a replayed answer carries.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The header that carries an API version, part of the fingerprint when present.
pub static PAYMENTS_VERSION: HeaderName = HeaderName::from_static("payments-version");

/// The request's `Idempotency-Key`, which this endpoint requires.
#[derive(Debug, Clone)]
pub struct RequiredKey(pub IdempotencyKey);

impl<S: Send + Sync> FromRequestParts<S> for RequiredKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let values = parts.headers.get_all("idempotency-key").iter().map(HeaderValue::as_bytes);
        match IdempotencyKey::from_header_values(values) {
            Ok(Some(key)) => Ok(Self(key)),
            Ok(None) => Err(ApiError::new(
                ProblemCode::IdempotencyKeyMissing,
                "This request moves money or creates an object, so it needs an Idempotency-Key header. \
                 Generate one per operation (a UUIDv4 is ideal) and send the same one on every retry.",
            )),
            Err(err) => Err(ApiError::new(ProblemCode::IdempotencyKeyInvalid, format!("{err}."))),
        }
    }
}

/// The request's `Idempotency-Key` where one is optional (PATCH): absent is `None`, malformed is
/// `400 idempotency_key_invalid`.
#[derive(Debug, Clone)]
pub struct OptionalKey(pub Option<IdempotencyKey>);

impl<S: Send + Sync> FromRequestParts<S> for OptionalKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let values = parts.headers.get_all("idempotency-key").iter().map(HeaderValue::as_bytes);
        IdempotencyKey::from_header_values(values)
            .map(Self)
            .map_err(|err| ApiError::new(ProblemCode::IdempotencyKeyInvalid, format!("{err}.")))
    }
}

/// What the fingerprint and the key record need from the request line and headers.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    /// The method.
    pub method: Method,
    /// The path as received.
    pub path: String,
    /// The query string, empty when absent.
    pub query: String,
    /// `Payments-Version`, when sent.
    pub version: Option<String>,
    /// The request's id.
    pub request_id: RequestId,
}

impl<S: Send + Sync> FromRequestParts<S> for RequestMeta {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let request_id = parts.extensions.get::<RequestId>().cloned().ok_or_else(|| {
            ApiError::internal(&std::io::Error::other("the edge did not assign a request id"))
        })?;
        let version = match parts.headers.get(&PAYMENTS_VERSION) {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .map_err(|_| {
                        ApiError::invalid_request(
                            "Payments-Version",
                            "The Payments-Version header is not visible ASCII.",
                        )
                    })?
                    .to_owned(),
            ),
        };
        Ok(Self {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            version,
            request_id,
        })
    }
}

/// A money-moving POST up to its claim: the caller, the request line, the key and the body, each
/// checked in the contract's order (authentication, key syntax, media type, body), so that the
/// first failure answers. The handler checks its own rules with `admit`, then `run`s.
#[derive(Debug)]
pub struct IdempotentPost<T> {
    /// Who sends it.
    pub caller: Caller,
    /// The request line and headers.
    pub meta: RequestMeta,
    /// The `Idempotency-Key`.
    pub key: IdempotencyKey,
    /// The body.
    pub body: JsonBody<T>,
}

impl<T: DeserializeOwned + Send> FromRequest<AppState> for IdempotentPost<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (mut parts, body) = request.into_parts();
        let caller = Caller::from_request_parts(&mut parts, state).await?;
        let rest = async {
            let meta = RequestMeta::from_request_parts(&mut parts, state).await?;
            let RequiredKey(key) = RequiredKey::from_request_parts(&mut parts, state).await?;
            let body = JsonBody::from_request(Request::from_parts(parts, body), state).await?;
            Ok((meta, key, body))
        };
        let (meta, key, body) = caller.admit(state, rest.await).await?;
        Ok(Self { caller, meta, key, body })
    }
}

impl<T> IdempotentPost<T> {
    /// The account the request acts for.
    pub fn account(&self) -> &AccountId {
        self.caller.account()
    }

    /// `result`, or `401` instead of its error when the caller's key turns out to be dead.
    pub async fn admit<U>(
        &self,
        state: &AppState,
        result: Result<U, impl Into<ApiError>>,
    ) -> Result<U, ApiError> {
        self.caller.admit(state, result.map_err(Into::into)).await
    }

    /// Claims the key and runs `operation` (stored with its name and input for the completer).
    pub async fn run<O: StartedOperation>(
        &self,
        state: &AppState,
        operation: O,
    ) -> Result<Response, ApiError> {
        let answer = self.keyed().run(state, operation).await;
        self.refused_if_dead(state, answer)
    }

    /// As [`IdempotentPost::run`], for an operation whose first phase claims the key
    /// ([`Runner::run_first`]).
    pub async fn run_first<O: StartedOperation + ClaimsInFirstPhase>(
        &self,
        state: &AppState,
        operation: O,
    ) -> Result<Response, ApiError> {
        let answer = self.keyed().run_first(state, operation).await;
        self.refused_if_dead(state, answer)
    }

    fn keyed(&self) -> Keyed<'_, T> {
        Keyed {
            account: self.account(),
            credential: self.caller.credential(),
            key: &self.key,
            meta: &self.meta,
            body: &self.body,
        }
    }

    fn refused_if_dead(
        &self,
        state: &AppState,
        answer: Result<Response, ApiError>,
    ) -> Result<Response, ApiError> {
        if matches!(&answer, Err(err) if err.code() == ProblemCode::InvalidApiKey) {
            self.caller.refused(state);
        }
        answer
    }
}

/// A request with an `Idempotency-Key`, as the claim sees it: who sends it, the key, the request
/// line and the body as sent. `IdempotentPost` is one; a handler whose key is optional makes one.
#[derive(Debug)]
pub struct Keyed<'a, T> {
    /// The account the key is scoped to.
    pub account: &'a AccountId,
    /// The API key's digest, when the claim must check it (`Caller::credential`).
    pub credential: Option<&'a [u8]>,
    /// The key.
    pub key: &'a IdempotencyKey,
    /// The request line and headers.
    pub meta: &'a RequestMeta,
    /// The body.
    pub body: &'a JsonBody<T>,
}

impl<T> Keyed<'_, T> {
    /// Claims the key and runs `operation`, stored as its [`PaymentOperation::NAME`] with its
    /// input, so that the completer resumes this very operation.
    pub async fn run<O: StartedOperation>(
        &self,
        state: &AppState,
        operation: O,
    ) -> Result<Response, ApiError> {
        state.runner.run(self.request(&operation)?, operation).await
    }

    /// As [`Keyed::run`], for an operation whose first phase claims the key
    /// ([`Runner::run_first`]).
    pub async fn run_first<O: StartedOperation + ClaimsInFirstPhase>(
        &self,
        state: &AppState,
        operation: O,
    ) -> Result<Response, ApiError> {
        state.runner.run_first(self.request(&operation)?, operation).await
    }

    /// The request as the engine claims it, for `operation`.
    fn request<O: StartedOperation>(&self, operation: &O) -> Result<idem::Request, ApiError> {
        let params =
            serde_json::to_value(operation.params()).map_err(|err| ApiError::internal(&err))?;
        self.request_for(O::NAME, params)
    }

    /// The request as the engine claims it: fingerprinted over the body as sent (not over the
    /// typed value with its defaults), stored with the operation's `name` and input (`params`)
    /// for the completer.
    pub fn request_for(&self, name: &str, params: Value) -> Result<idem::Request, ApiError> {
        let body: Value = serde_json::from_slice(&self.body.raw)
            .map_err(|err| ApiError::invalid_request("body", err.to_string()))?;
        let fingerprint = Fingerprint::of(&RequestParts {
            method: self.meta.method.as_str(),
            path: &self.meta.path,
            query: &self.meta.query,
            media_type: self.body.media_type.essence(),
            version: self.meta.version.as_deref(),
            body: &body,
        });
        Ok(idem::Request {
            account_id: self.account.as_str().into(),
            credential: self.credential.map(Into::into),
            key: self.key.clone(),
            fingerprint,
            method: self.meta.method.as_str().into(),
            path: self.meta.path.as_str().into(),
            request_id: self.meta.request_id.as_str().into(),
            operation: name.into(),
            params: params.into(),
        })
    }
}

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

    /// Claims the key and answers: a replay, a refusal, or the operation's own answer. The
    /// claim's read runs here; taking the key and the operation run on a task that outlives the
    /// request.
    pub async fn run<O: Operation + 'static>(
        &self,
        request: idem::Request,
        mut operation: O,
    ) -> Result<Response, ApiError> {
        // The claim's read runs on the request's own task: it writes nothing, so a client that
        // hangs up meanwhile leaves nothing behind, and a replay or a refusal is answered without
        // a task of its own. A key this request may take is taken on the task, which owns a copy
        // of the request.
        let open = match self.engine.read_claim(&request).await {
            Ok(Read::Decided(claim)) => return claimed(claim, &request.key),
            Ok(Read::Open(open)) => open,
            Err(err) if err.timed_out() => return Err(claim_timed_out()),
            Err(err) => return Err(ApiError::internal(&err)),
        };
        let key = request.key.clone();
        let engine = self.engine.clone();
        let task = self.tasks.spawn(
            async move {
                let mut open = Some(open);
                // A new key's first phase can find that another request stored the key first;
                // claiming again then reads it (stored now, so at most once more).
                for _ in 0..2 {
                    let taken = match open.take() {
                        Some(open) => engine.take(open, &request).await?,
                        None => None,
                    };
                    // Taken by another request between the read and the take: claim again.
                    let claim = match taken {
                        Some(claim) => claim,
                        None => engine.claim(&request).await?,
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

    /// As [`Runner::run`], for an operation whose first phase claims the key: a replay kept in
    /// memory is answered here, on the request's own task, like the claim's read; otherwise the
    /// claim and the first phase are one statement ([`Engine::claim_first`]), which writes, so it
    /// runs on the operation's task with the rest.
    pub async fn run_first<O: ClaimsInFirstPhase + 'static>(
        &self,
        request: idem::Request,
        mut operation: O,
    ) -> Result<Response, ApiError> {
        if let Some(claim) = self.engine.cached_answer(&request).await {
            return claimed(claim, &request.key);
        }
        let key = request.key.clone();
        let engine = self.engine.clone();
        let task = self.tasks.spawn(
            async move {
                // Claimed again, once, when another request took an unfinished key between the
                // read and the take; missed twice (each taker gave the key back at once), the
                // key is in use: `409`, which the client retries.
                for _ in 0..2 {
                    let first = {
                        let mut first = operation.first(&request.request_id);
                        engine.claim_first(&request, &mut first).await
                    };
                    let lease = match first {
                        Ok(First::Ran(lease, made)) => {
                            operation.ran_first(made);
                            lease
                        }
                        Ok(First::Decided(claim)) => return Ok(Ran::Claimed(claim)),
                        Ok(First::Open(open)) => match engine.take(open, &request).await? {
                            Some(Claim::Acquired(lease)) => lease,
                            Some(claim) => return Ok(Ran::Claimed(claim)),
                            None => continue,
                        },
                        // Before any lease, as a claim's: a wait given up is a 503.
                        Err(PhaseError::Database(err)) => {
                            return Err(idem::IdemError::Database(err));
                        }
                        Err(err) => return Ok(Ran::Driven(Err(Interrupted::from(err)))),
                    };
                    return Ok(Ran::Driven(idem::drive(&mut operation, lease).await));
                }
                Err(idem::IdemError::Contended)
            }
            .in_current_span(),
        );
        answered(task.await, &key)
    }
}

/// The answer to what a request's task did.
fn answered(
    task: Result<Result<Ran, idem::IdemError>, tokio::task::JoinError>,
    key: &IdempotencyKey,
) -> Result<Response, ApiError> {
    match task {
        Ok(Ok(Ran::Driven(Ok(stored)))) => Ok(stored_response(stored, false)),
        Ok(Ok(Ran::Driven(Err(interrupted)))) => Err(interrupted_error(interrupted)),
        Ok(Ok(Ran::Claimed(claim))) => claimed(claim, key),
        // Other requests kept taking the key and giving it back: it is in use, and a retry with
        // the same key gets its answer, as the 409's `Retry-After` promises.
        Ok(Err(idem::IdemError::Contended)) => Err(in_use()),
        Ok(Err(err)) if err.timed_out() => Err(claim_timed_out()),
        Ok(Err(err)) => Err(ApiError::internal(&err)),
        Err(join_error) => Err(ApiError::internal(&join_error)),
    }
}

/// The answer to a claim decided without a lease.
fn claimed(claim: Claim, key: &IdempotencyKey) -> Result<Response, ApiError> {
    match claim {
        // A lease is driven on the operation's task, never answered here.
        Claim::Acquired(_) => {
            Err(ApiError::internal(&std::io::Error::other("a claimed lease came back undriven")))
        }
        Claim::Replay(stored) => Ok(stored_response(stored, true)),
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
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
