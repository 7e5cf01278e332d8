//! How an answer, or its absence, becomes a [`ProcessorError`]: a transport failure, a success
//! whose body cannot be read, and each HTTP status with its error body, sorted by what the
//! caller may do about it.

use reqwest::StatusCode;

use super::{ProcessorError, ReconcileCause, TransientCause};
use crate::types::{ErrorBody, ErrorEnvelope};

pub(super) fn unknown(message: String) -> ProcessorError {
    ProcessorError::UnknownOutcome { message }
}

pub(super) fn transport_error(err: &reqwest::Error) -> ProcessorError {
    if err.is_connect() && !err.is_timeout() {
        ProcessorError::Unavailable { cause: TransientCause::Connect, message: err.to_string() }
    } else {
        // A timeout, or a connection that broke after the request was sent.
        unknown(err.to_string())
    }
}

/// A 2xx whose body does not read as the object asked for. The processor did what it was asked:
/// the call must not be sent again (a server that ignores idempotency keys would act twice), so
/// the object is looked up instead, never retried, never stored as an answer.
pub(super) fn unreadable_success(status: StatusCode, err: &serde_json::Error) -> ProcessorError {
    ProcessorError::MustReconcile {
        cause: ReconcileCause::UnreadableAnswer,
        message: format!("an unreadable answer with status {status}: {err}"),
    }
}

pub(super) fn status_error(status: StatusCode, body: &[u8], replayed: bool) -> ProcessorError {
    let unavailable = |cause, message: &str| ProcessorError::Unavailable {
        cause,
        message: format!("{status}: {message}"),
    };
    let parsed = serde_json::from_slice::<ErrorEnvelope>(body).map(|envelope| envelope.error);
    match (status.as_u16(), parsed) {
        // A failure the processor stored for the key and replays: a retry can only get it again.
        (code @ 500..=599, _) if replayed => ProcessorError::MustReconcile {
            cause: ReconcileCause::ReplayedFailure(code),
            message: format!("the processor replays a {status} for this key"),
        },
        (401 | 403, error) => unavailable(TransientCause::Authentication, &message_of(error)),
        (409, error) => unavailable(TransientCause::Conflict, &message_of(error)),
        (429, error) => unavailable(TransientCause::RateLimited, &message_of(error)),
        (code @ 500..=599, error) => {
            unavailable(TransientCause::ServerError(code), &message_of(error))
        }
        (_, Ok(error)) if error.type_ == "idempotency_error" => ProcessorError::MustReconcile {
            cause: ReconcileCause::KeyReused,
            message: error.message,
        },
        (402, Ok(error)) => ProcessorError::Declined {
            decline_code: error.decline_code.unwrap_or_else(|| "generic_decline".to_owned()),
            message: error.message,
            charge_id: error.charge,
            payment_intent: error.payment_intent,
        },
        (code, Ok(error)) => ProcessorError::Invalid {
            status: code,
            code: error.code,
            param: error.param,
            message: error.message,
        },
        // A refusal we cannot read is no answer to store: we do not know what was refused.
        (_, Err(err)) => unknown(format!("an unreadable error answer with status {status}: {err}")),
    }
}

fn message_of(error: Result<ErrorBody, serde_json::Error>) -> String {
    error.map(|e| e.message).unwrap_or_else(|_| "(no readable error body)".to_owned())
}
