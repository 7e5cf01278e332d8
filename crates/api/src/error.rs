//! The error model of the HTTP edge: one `ApiError`, a stable `code` per kind, rendered as
//! RFC 9457 problem details.
//!
//! A handler returns `ApiError`; its `IntoResponse` only stashes the error in the response's
//! extensions. The edge middleware (`crate::edge`), which knows the request id and the public
//! base URL, renders the body. So every problem, including those raised by extractors and by a
//! panic, carries the same `type`, `request_id` and content type.

use std::fmt;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use payments_domain::DomainError;
use serde::Serialize;
use serde_json::{Map, Value};

/// The catalogue of problems (api.md, "Errors"). The code strings are a public contract: never
/// rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemCode {
    /// A POST that requires an Idempotency-Key arrived without one.
    IdempotencyKeyMissing,
    /// The Idempotency-Key header does not parse.
    IdempotencyKeyInvalid,
    /// The key was first used with a different request.
    IdempotencyKeyReused,
    /// The first request with this key is still running.
    IdempotencyKeyInUse,
    /// A parameter is missing, malformed or out of range.
    InvalidRequest,
    /// The object is not in a state that allows the operation.
    PaymentUnexpectedState,
    /// An amount exceeds what the object allows.
    AmountTooLarge,
    /// No usable credentials.
    AuthenticationRequired,
    /// The credentials name no live key.
    InvalidApiKey,
    /// The processor declined the card.
    CardDeclined,
    /// Unknown id or URL, or another account's object.
    ResourceMissing,
    /// The route exists but not for this method.
    MethodNotAllowed,
    /// `If-Match` does not match.
    PreconditionFailed,
    /// The body is larger than the limit.
    PayloadTooLarge,
    /// The body is not JSON.
    UnsupportedMediaType,
    /// The account is over its request rate.
    RateLimited,
    /// The processor could not be reached or failed transiently.
    ProcessorUnavailable,
    /// Anything unexpected; nothing was committed beyond the last recovery point.
    InternalError,
}

/// Documentation of one problem code, served at `/problems/{code}`.
#[derive(Debug)]
pub struct ProblemDoc {
    /// The stable code.
    pub code: ProblemCode,
    /// What happened, in one sentence.
    pub description: &'static str,
    /// What the client should do.
    pub remedy: &'static str,
    /// Whether the answer is stored against the Idempotency-Key and replayed.
    pub stored_for_replay: &'static str,
}

impl ProblemCode {
    /// Every code, in catalogue order.
    pub const ALL: [ProblemCode; 18] = [
        Self::IdempotencyKeyMissing,
        Self::IdempotencyKeyInvalid,
        Self::IdempotencyKeyReused,
        Self::IdempotencyKeyInUse,
        Self::InvalidRequest,
        Self::PaymentUnexpectedState,
        Self::AmountTooLarge,
        Self::AuthenticationRequired,
        Self::InvalidApiKey,
        Self::CardDeclined,
        Self::ResourceMissing,
        Self::MethodNotAllowed,
        Self::PreconditionFailed,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::RateLimited,
        Self::ProcessorUnavailable,
        Self::InternalError,
    ];

    /// The machine-readable code.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdempotencyKeyMissing => "idempotency_key_missing",
            Self::IdempotencyKeyInvalid => "idempotency_key_invalid",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::IdempotencyKeyInUse => "idempotency_key_in_use",
            Self::InvalidRequest => "invalid_request",
            Self::PaymentUnexpectedState => "payment_unexpected_state",
            Self::AmountTooLarge => "amount_too_large",
            Self::AuthenticationRequired => "authentication_required",
            Self::InvalidApiKey => "invalid_api_key",
            Self::CardDeclined => "card_declined",
            Self::ResourceMissing => "resource_missing",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PreconditionFailed => "precondition_failed",
            Self::PayloadTooLarge => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::RateLimited => "rate_limited",
            Self::ProcessorUnavailable => "processor_unavailable",
            Self::InternalError => "internal_error",
        }
    }

    /// Looks a code up by its string.
    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The HTTP status that goes with the code.
    pub fn status(self) -> StatusCode {
        match self {
            Self::IdempotencyKeyMissing
            | Self::IdempotencyKeyInvalid
            | Self::InvalidRequest
            | Self::PaymentUnexpectedState
            | Self::AmountTooLarge => StatusCode::BAD_REQUEST,
            Self::AuthenticationRequired | Self::InvalidApiKey => StatusCode::UNAUTHORIZED,
            Self::CardDeclined => StatusCode::PAYMENT_REQUIRED,
            Self::ResourceMissing => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::IdempotencyKeyInUse => StatusCode::CONFLICT,
            Self::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Self::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ProcessorUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The title: fixed for a code, never varies with the occurrence.
    pub fn title(self) -> &'static str {
        match self {
            Self::IdempotencyKeyMissing => "Idempotency-Key required",
            Self::IdempotencyKeyInvalid => "Idempotency-Key is not valid",
            Self::IdempotencyKeyReused => "Idempotency-Key reused with a different request",
            Self::IdempotencyKeyInUse => "Idempotency-Key in use by a request in progress",
            Self::InvalidRequest => "Invalid request",
            Self::PaymentUnexpectedState => "Payment is not in a state that allows this",
            Self::AmountTooLarge => "Amount too large",
            Self::AuthenticationRequired => "Authentication required",
            Self::InvalidApiKey => "Invalid API key",
            Self::CardDeclined => "Card declined",
            Self::ResourceMissing => "No such resource",
            Self::MethodNotAllowed => "Method not allowed",
            Self::PreconditionFailed => "Precondition failed",
            Self::PayloadTooLarge => "Request body too large",
            Self::UnsupportedMediaType => "Unsupported media type",
            Self::RateLimited => "Too many requests",
            Self::ProcessorUnavailable => "Card processor unavailable",
            Self::InternalError => "Internal error",
        }
    }

    /// The documentation page's content.
    pub fn doc(self) -> ProblemDoc {
        let (description, remedy, stored_for_replay) = match self {
            Self::IdempotencyKeyMissing => (
                "This request creates an object or moves money, and such requests must carry an Idempotency-Key header.",
                "Generate a unique key (a UUIDv4 is ideal) for the operation, send it, and reuse it on every retry of that operation.",
                "No.",
            ),
            Self::IdempotencyKeyInvalid => (
                "The Idempotency-Key header could not be parsed: it must be 1 to 255 visible ASCII characters, or an RFC 9651 string holding them, on a single header line.",
                "Send one Idempotency-Key header with a valid value.",
                "No.",
            ),
            Self::IdempotencyKeyReused => (
                "The key was first used for a request with a different method, path, query string, media type or body. A key names one operation.",
                "Use a new key for a new operation. The original operation and its stored answer are untouched.",
                "No; the original record stays as it was.",
            ),
            Self::IdempotencyKeyInUse => (
                "Another request with the same key is still being processed.",
                "Retry with the same key after the number of seconds in Retry-After; you will receive that request's answer.",
                "No.",
            ),
            Self::InvalidRequest => (
                "A parameter is missing, malformed or out of range; `param` names it.",
                "Correct the parameter. When the problem was found before execution began nothing was stored, so the same key may be sent again with the corrected request.",
                "No when found by validation; yes when the processor rejected the request after execution began.",
            ),
            Self::PaymentUnexpectedState => (
                "The payment is not in a state that allows this operation, for example a capture of a payment that does not await capture.",
                "Read the payment to see its status.",
                "Yes.",
            ),
            Self::AmountTooLarge => (
                "The amount exceeds what the payment allows: a refund beyond what remains, or a capture above the authorized amount.",
                "Send a smaller amount.",
                "Yes.",
            ),
            Self::AuthenticationRequired => (
                "The request carried no credentials, or they were malformed.",
                "Send `Authorization: Bearer sk_test_…`, or HTTP Basic with the key as the user name and an empty password.",
                "No.",
            ),
            Self::InvalidApiKey => (
                "The API key is unknown or has been revoked.",
                "Check the key, or ask an operator for a new one.",
                "No.",
            ),
            Self::CardDeclined => (
                "The card processor declined the card. `decline_code` says why and `payment_id` names the failed payment.",
                "Ask the customer for another payment method and make a new payment with a new key.",
                "Yes.",
            ),
            Self::ResourceMissing => (
                "No object with this id exists in your account, or the URL is not one this API serves.",
                "Check the id and the URL.",
                "No.",
            ),
            Self::MethodNotAllowed => (
                "The URL exists but does not accept this HTTP method.",
                "Use a method the URL supports; the Allow header lists them.",
                "No.",
            ),
            Self::PreconditionFailed => (
                "The If-Match header does not match the object's current ETag: it changed since you read it.",
                "Read the object again and retry with its new ETag.",
                "No.",
            ),
            Self::PayloadTooLarge => (
                "The request body is larger than the configured limit.",
                "Send a smaller body.",
                "No.",
            ),
            Self::UnsupportedMediaType => (
                "The body is not JSON (`application/json`; PATCH also accepts `application/merge-patch+json`).",
                "Send a JSON body with a JSON Content-Type.",
                "No.",
            ),
            Self::RateLimited => (
                "The account sent more requests than its rate limit allows.",
                "Retry after the number of seconds in Retry-After, with the same Idempotency-Key.",
                "No.",
            ),
            Self::ProcessorUnavailable => (
                "The card processor could not be reached or failed transiently. The operation stopped at its last recovery point.",
                "Retry with the same Idempotency-Key after Retry-After; the operation resumes where it stopped and is never performed twice.",
                "No.",
            ),
            Self::InternalError => (
                "An unexpected failure. Nothing was committed beyond the operation's last recovery point.",
                "Retry with the same Idempotency-Key; the operation resumes where it stopped. Quote the request_id when you report it.",
                "No.",
            ),
        };
        ProblemDoc { code: self, description, remedy, stored_for_replay }
    }
}

impl fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    code: ProblemCode,
    detail: String,
    param: Option<String>,
    /// Members beyond the standard ones (`decline_code`, `payment_id`).
    extensions: Map<String, Value>,
    retry_after_seconds: Option<u32>,
    /// Extra response headers (e.g. `Allow`, `WWW-Authenticate`).
    headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl ApiError {
    /// An error of the given code with a detail for people.
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Self {
        let retry_after_seconds = match code {
            ProblemCode::IdempotencyKeyInUse
            | ProblemCode::RateLimited
            | ProblemCode::ProcessorUnavailable
            | ProblemCode::InternalError => Some(1),
            _ => None,
        };
        Self {
            code,
            detail: detail.into(),
            param: None,
            extensions: Map::new(),
            retry_after_seconds,
            headers: Vec::new(),
        }
    }

    /// `400 invalid_request` naming the parameter.
    pub fn invalid_request(param: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ProblemCode::InvalidRequest, detail).with_param(param)
    }

    /// `401 authentication_required`.
    pub fn authentication_required(detail: impl Into<String>) -> Self {
        Self::new(ProblemCode::AuthenticationRequired, detail).with_header(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"payments\""),
        )
    }

    /// `404 resource_missing`.
    pub fn resource_missing(detail: impl Into<String>) -> Self {
        Self::new(ProblemCode::ResourceMissing, detail)
    }

    /// `500 internal_error`. The cause is logged here, with the request's span, and never sent.
    pub fn internal(cause: &(dyn std::error::Error + 'static)) -> Self {
        tracing::error!(error = %ErrorChain(cause), "internal error");
        Self::new(
            ProblemCode::InternalError,
            "An unexpected error occurred. Retry the request; with the same Idempotency-Key it resumes where it stopped.",
        )
    }

    /// Names the offending parameter.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Adds a member to the problem body.
    pub fn with_extension(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// Adds a response header.
    pub fn with_header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The stable code.
    pub fn code(&self) -> ProblemCode {
        self.code
    }

    /// The detail for people.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The full response, once the request id and the public base URL are known.
    pub fn render(&self, request_id: &str, public_base_url: &str) -> Response {
        let body = ProblemBody {
            type_: format!("{public_base_url}/problems/{}", self.code),
            title: self.code.title(),
            status: self.code.status().as_u16(),
            detail: &self.detail,
            code: self.code.as_str(),
            param: self.param.as_deref(),
            request_id,
            extensions: &self.extensions,
        };
        let bytes = match serde_json::to_vec(&body) {
            Ok(bytes) => bytes,
            // Serialising strings and maps of JSON values cannot fail; answer something valid anyway.
            Err(_) => br#"{"code":"internal_error","status":500}"#.to_vec(),
        };
        let mut response = (self.code.status(), bytes).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after_seconds {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
        response
    }
}

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

#[derive(Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    type_: String,
    title: &'static str,
    status: u16,
    detail: &'a str,
    code: &'static str,
    param: Option<&'a str>,
    request_id: &'a str,
    #[serde(flatten)]
    extensions: &'a Map<String, Value>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    /// Stashes the error for the edge middleware, which renders it with the request's context.
    fn into_response(self) -> Response {
        let mut response = self.code.status().into_response();
        response.extensions_mut().insert(self);
        response
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        Self::internal(&err)
    }
}

impl From<DomainError> for ApiError {
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::Database(err) => Self::internal(&err),
            DomainError::Invalid { param, message } => Self::invalid_request(param, message),
            DomainError::NotFound(what) => Self::resource_missing(format!("No such {what}.")),
        }
    }
}

/// Formats an error with its chain of sources, for logs.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
