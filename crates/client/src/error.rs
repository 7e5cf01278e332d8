//! What a call can end in: the API's problems with their codes typed, and the client's own
//! failures (it gave up, could not read an answer, or could not be made).

use serde::Deserialize;

/// The stable problem codes of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Code {
    /// `idempotency_key_reused`: the key was used for another request.
    IdempotencyKeyReused,
    /// `idempotency_key_invalid` or `idempotency_key_missing`.
    IdempotencyKeyInvalid,
    /// `invalid_request`: see `param`.
    InvalidRequest,
    /// `card_declined`: see `decline_code`.
    CardDeclined,
    /// `payment_unexpected_state`.
    PaymentUnexpectedState,
    /// `payment_requires_action`: a capture or cancel of a payment whose customer has not
    /// authenticated yet. Send them to its `next_action`, and try again once it
    /// `requires_capture`, under a new key (this answer is stored for the key).
    PaymentRequiresAction,
    /// `amount_too_large`.
    AmountTooLarge,
    /// `resource_missing`.
    ResourceMissing,
    /// `authentication_required` or `invalid_api_key`.
    Unauthorized,
    /// `precondition_failed`.
    PreconditionFailed,
    /// `operation_needs_review`: the operation was referred to an operator. Do not retry it, and
    /// do not repeat it under a new key: it may already have taken effect.
    OperationNeedsReview,
    /// Any other code (`payload_too_large`, …, or one this client does not know yet).
    Other(String),
}

impl Code {
    pub(crate) fn parse(code: &str) -> Self {
        match code {
            "idempotency_key_reused" => Self::IdempotencyKeyReused,
            "idempotency_key_invalid" | "idempotency_key_missing" => Self::IdempotencyKeyInvalid,
            "invalid_request" => Self::InvalidRequest,
            "card_declined" => Self::CardDeclined,
            "payment_unexpected_state" => Self::PaymentUnexpectedState,
            "payment_requires_action" => Self::PaymentRequiresAction,
            "amount_too_large" => Self::AmountTooLarge,
            "resource_missing" => Self::ResourceMissing,
            "authentication_required" | "invalid_api_key" => Self::Unauthorized,
            "precondition_failed" => Self::PreconditionFailed,
            "operation_needs_review" => Self::OperationNeedsReview,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// A problem the API answered with.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// The stable code, as sent.
    pub code: String,
    /// For people.
    #[serde(default)]
    pub detail: String,
    /// The offending parameter.
    #[serde(default)]
    pub param: Option<String>,
    /// For declines.
    #[serde(default)]
    pub decline_code: Option<String>,
    /// For declines: the failed payment.
    #[serde(default)]
    pub payment_id: Option<String>,
    /// The request that first produced this answer.
    #[serde(default)]
    pub request_id: Option<String>,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A final answer that is an error: retrying with the same key returns it again.
    #[error("{code:?} ({}): {}", problem.status, problem.detail)]
    Api {
        /// The code, typed.
        code: Code,
        /// The problem as sent.
        problem: Box<Problem>,
        /// The key it ran under.
        key: Option<String>,
        /// Whether it was a replay.
        replayed: bool,
    },
    /// Every try failed in a way worth retrying; the operation may or may not have run. Ask
    /// again later with `key` to learn how it ended.
    #[error("gave up after {attempts} attempts (last: {last})")]
    GaveUp {
        /// The key to ask again with.
        key: Option<String>,
        /// Requests made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// An answer this client could not read.
    #[error("unreadable answer: {0}")]
    Decode(String),
    /// The client could not be made (its HTTP stack could not be set up).
    #[error("the client could not be made: {0}")]
    Setup(String),
}

impl Error {
    /// The typed code of an API error.
    pub fn code(&self) -> Option<&Code> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}
