//! What a handler of an idempotent request extracts: the `Idempotency-Key` (required or optional),
//! the request line, a money-moving POST taken apart in the contract's order, and the request as
//! the engine claims it ([`Keyed::request_for`]).

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::response::Response;
use idem::{Fingerprint, IdempotencyKey, RequestParts};
use payments_domain::AccountId;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::app::AppState;
use crate::auth::Caller;
use crate::edge::RequestId;
use crate::error::{ApiError, ProblemCode};
use crate::extract::JsonBody;

use super::{PAYMENTS_VERSION, StartedOperation};

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
    /// `If-Match`, when sent: a keyed PATCH's precondition, part of its fingerprint.
    pub if_match: Option<String>,
    /// The request's id.
    pub request_id: RequestId,
}

impl<S: Send + Sync> FromRequestParts<S> for RequestMeta {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let request_id = parts.extensions.get::<RequestId>().cloned().ok_or_else(|| {
            ApiError::internal(&std::io::Error::other("the edge did not assign a request id"))
        })?;
        let version = ascii_header(parts, &PAYMENTS_VERSION, "Payments-Version")?;
        let if_match = ascii_header(parts, &header::IF_MATCH, "If-Match")?;
        Ok(Self {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            version,
            if_match,
            request_id,
        })
    }
}

/// A header's value when sent, which must be visible ASCII to be part of a fingerprint.
fn ascii_header(parts: &Parts, name: &HeaderName, label: &str) -> Result<Option<String>, ApiError> {
    let Some(value) = parts.headers.get(name) else { return Ok(None) };
    let text = value.to_str().map_err(|_| {
        ApiError::invalid_request(label, format!("The {label} header is not visible ASCII."))
    })?;
    Ok(Some(text.to_owned()))
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
    /// Claims the key and runs `operation`, stored as its
    /// [`PaymentOperation::NAME`](payments_domain::operations::PaymentOperation::NAME) with its
    /// input, so that the completer resumes this very operation.
    pub async fn run<O: StartedOperation>(
        &self,
        state: &AppState,
        operation: O,
    ) -> Result<Response, ApiError> {
        state.runner.run(self.request(&operation)?, operation).await
    }

    /// Like [`run`](Self::run), the stored answer and whether it is a replay
    /// ([`Runner::answer`](super::Runner::answer)).
    pub async fn answer<O: StartedOperation>(
        &self,
        state: &AppState,
        operation: O,
    ) -> Result<(idem::StoredResponse, bool), ApiError> {
        state.runner.answer(self.request(&operation)?, operation).await
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
            if_match: self.meta.if_match.as_deref(),
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
