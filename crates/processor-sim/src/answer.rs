//! What the stand-in answers: an [`Answer`] from the ledger, with what the idempotency rules need
//! to know about it, and the plain errors of the fault middleware and the `/_sim` surface, in
//! Stripe's error shape (`{"error": {"type", "code", "param", "message"}}`).

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One answer, ready to send.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub body: Value,
    /// Sent from an idempotency record.
    pub replayed: bool,
    /// The operation began executing: it was not refused on the request's form or parameters.
    /// In `stripe` mode this is what decides that the key keeps the answer.
    pub executed: bool,
    /// The key keeps this answer (or it came from a record): a kept 500 will be replayed, so
    /// retrying it cannot help.
    pub kept: bool,
}

impl Answer {
    pub(crate) fn ok(body: Value) -> Self {
        Self { status: StatusCode::OK, body, replayed: false, executed: true, kept: false }
    }

    /// An error the operation raised once it was executing (a missing charge, a charge in the
    /// wrong state): kept against the key in `stripe` mode.
    pub(crate) fn error(
        status: StatusCode,
        type_: &str,
        code: &str,
        param: Option<&str>,
        message: &str,
    ) -> Self {
        let mut error = json!({"type": type_, "code": code, "message": message});
        if let Some(param) = param {
            error["param"] = param.into();
        }
        Self {
            status,
            body: json!({ "error": error }),
            replayed: false,
            executed: true,
            kept: false,
        }
    }

    /// A refusal before the operation began (no API key, a malformed body, a parameter that
    /// fails validation): never kept, so a corrected retry with the same key executes.
    pub(crate) fn refused(
        status: StatusCode,
        type_: &str,
        code: &str,
        param: Option<&str>,
        message: &str,
    ) -> Self {
        Self { executed: false, ..Self::error(status, type_, code, param, message) }
    }

    /// A 400 the operation raised.
    pub(crate) fn invalid(code: &str, param: Option<&str>, message: &str) -> Self {
        Self::error(StatusCode::BAD_REQUEST, "invalid_request_error", code, param, message)
    }

    /// A 400 for a parameter that fails validation, before the operation began.
    pub(crate) fn bad_param(code: &str, param: Option<&str>, message: &str) -> Self {
        Self::refused(StatusCode::BAD_REQUEST, "invalid_request_error", code, param, message)
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if self.replayed {
            response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        if self.kept && self.status.is_server_error() {
            // What Stripe tells its SDKs about a 500 its idempotency layer will replay: a retry
            // with the same key gets the same 500.
            response.headers_mut().insert("stripe-should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}

/// An error outside the ledger (an injected fault, a bad `/_sim` document): a type and a message,
/// no code.
pub(crate) fn plain_error(status: StatusCode, type_: &str, message: &str) -> Response {
    (status, Json(json!({"error": {"type": type_, "message": message}}))).into_response()
}
