//! The public catalogue of problems (RFC 9457) and the one renderer of problem bodies.
//!
//! It lives here, not at the HTTP edge, because some problems are final answers stored against an
//! idempotency key (a decline, a domain rule), and the completer, which never goes through the
//! API, must store byte-for-byte what the API would have sent.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

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
    /// The payment waits on its customer to authenticate: nothing can be done to it yet.
    PaymentRequiresAction,
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
    /// No automatic retry may drive the key's operation (older than the processor's window, or
    /// an outcome that could not be reconciled): a person decides. No retry can help.
    OperationNeedsReview,
    /// Anything unexpected; nothing was committed beyond the last recovery point.
    InternalError,
    /// The server could not take the request on right now (more requests in flight than it
    /// serves at once, or it gave up waiting for a connection or for the key's row held by
    /// another transaction); nothing was stored.
    ServiceUnavailable,
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
    pub const ALL: [ProblemCode; 21] = [
        Self::IdempotencyKeyMissing,
        Self::IdempotencyKeyInvalid,
        Self::IdempotencyKeyReused,
        Self::IdempotencyKeyInUse,
        Self::InvalidRequest,
        Self::PaymentUnexpectedState,
        Self::PaymentRequiresAction,
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
        Self::OperationNeedsReview,
        Self::InternalError,
        Self::ServiceUnavailable,
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
            Self::PaymentRequiresAction => "payment_requires_action",
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
            Self::OperationNeedsReview => "operation_needs_review",
            Self::InternalError => "internal_error",
            Self::ServiceUnavailable => "service_unavailable",
        }
    }

    /// Looks a code up by its string.
    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The HTTP status that goes with the code.
    pub fn status(self) -> u16 {
        match self {
            Self::IdempotencyKeyMissing
            | Self::IdempotencyKeyInvalid
            | Self::InvalidRequest
            | Self::PaymentUnexpectedState
            | Self::PaymentRequiresAction
            | Self::AmountTooLarge => 400,
            Self::AuthenticationRequired | Self::InvalidApiKey => 401,
            Self::CardDeclined => 402,
            Self::ResourceMissing => 404,
            Self::MethodNotAllowed => 405,
            Self::IdempotencyKeyInUse => 409,
            Self::PreconditionFailed => 412,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::IdempotencyKeyReused | Self::OperationNeedsReview => 422,
            Self::RateLimited => 429,
            Self::InternalError => 500,
            Self::ProcessorUnavailable | Self::ServiceUnavailable => 503,
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
            Self::PaymentRequiresAction => "Payment waits on its customer's authentication",
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
            Self::OperationNeedsReview => "Operation referred to an operator",
            Self::InternalError => "Internal error",
            Self::ServiceUnavailable => "Service unavailable",
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
            Self::PaymentRequiresAction => (
                "The payment `requires_action`: its customer must authenticate (3-D Secure) before it is authorized or declined, so it can be neither captured nor canceled yet. Its outcome arrives later, by the processor's webhook or the worker's look at the processor; a payment nobody authenticates is canceled when its authentication expires.",
                "Send the customer to the URL in the payment's `next_action`, then read the payment (or listen for its `payment.requires_capture`, `payment.succeeded`, `payment.failed` or `payment.canceled` event) and try again once it `requires_capture`.",
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
                "No, except for a keyed update of a webhook endpoint deleted for good.",
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
            Self::OperationNeedsReview => (
                "The operation with this Idempotency-Key cannot be finished automatically: it is older than the card processor's own idempotency window (after which a retry could act twice), or the processor's records could not be reconciled with ours. It is referred to an operator, and no retry, with this key or any other, is needed or will change this answer.",
                "Do not retry, and do not repeat the operation under a new key: it may already have taken effect. Read the object (for a payment, GET /v1/payments/{id}) to see where it stands, and quote the request_id to support.",
                "No; every request with the key gets this answer until an operator resolves it.",
            ),
            Self::InternalError => (
                "An unexpected failure. Nothing was committed beyond the operation's last recovery point.",
                "Retry with the same Idempotency-Key; the operation resumes where it stopped. Quote the request_id when you report it.",
                "No.",
            ),
            Self::ServiceUnavailable => (
                "The server could not take the request on right now: it is serving as many requests as it takes at once, or looking up as many new API keys as it does in a second, or it gave up waiting for a database connection or for the key's record, which another transaction holds. Nothing ran and nothing was stored.",
                "Retry after the number of seconds in Retry-After, with the same Idempotency-Key.",
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

/// One occurrence of a problem, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The stable code.
    pub code: ProblemCode,
    /// What happened this time, for people.
    pub detail: String,
    /// The offending parameter.
    pub param: Option<String>,
    /// Members beyond the standard ones (`decline_code`, `payment_id`).
    pub extensions: Map<String, Value>,
}

impl Problem {
    /// A problem of the given code.
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self { code, detail: detail.into(), param: None, extensions: Map::new() }
    }

    /// Names the offending parameter.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Adds a member to the body.
    pub fn with_extension(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// The body bytes: `type` is `{public_base_url}/problems/{code}`.
    pub fn render(&self, request_id: &str, public_base_url: &str) -> Vec<u8> {
        let body = ProblemBody {
            type_: format!("{public_base_url}/problems/{}", self.code),
            title: self.code.title(),
            status: self.code.status(),
            detail: &self.detail,
            code: self.code.as_str(),
            param: self.param.as_deref(),
            request_id,
            extensions: &self.extensions,
        };
        // Serialising strings and JSON values cannot fail; answer something valid anyway.
        serde_json::to_vec(&body)
            .unwrap_or_else(|_| br#"{"code":"internal_error","status":500}"#.to_vec())
    }
}

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
