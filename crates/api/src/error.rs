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
use payments_domain::problems::Problem;
pub use payments_domain::problems::{PROBLEM_JSON, ProblemCode, ProblemDoc};
use serde_json::Value;

/// The `Retry-After` a problem of this code carries unless its raiser sets another (the OpenAPI
/// document lists the header on the responses of these codes): the problems a retry can cure.
pub fn retry_after_seconds(code: ProblemCode) -> Option<u32> {
    match code {
        ProblemCode::IdempotencyKeyInUse
        | ProblemCode::RateLimited
        | ProblemCode::ProcessorUnavailable
        | ProblemCode::InternalError
        | ProblemCode::ServiceUnavailable => Some(1),
        _ => None,
    }
}

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    problem: Problem,
    retry_after_seconds: Option<u32>,
    /// Extra response headers (e.g. `WWW-Authenticate`).
    headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl ApiError {
    /// An error of the given code with a detail for people.
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::from_problem(Problem::new(code, detail))
    }

    /// An error that answers with `problem`.
    pub fn from_problem(problem: Problem) -> Self {
        let retry_after_seconds = retry_after_seconds(problem.code);
        Self { problem, retry_after_seconds, headers: Vec::new() }
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
        self.problem.param = Some(param.into());
        self
    }

    /// Adds a member to the problem body.
    pub fn with_extension(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.problem.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// Sets `Retry-After`, in whole seconds.
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after_seconds = Some(seconds.max(1));
        self
    }

    /// Adds a response header.
    pub fn with_header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The stable code.
    pub fn code(&self) -> ProblemCode {
        self.problem.code
    }

    /// The detail for people.
    pub fn detail(&self) -> &str {
        &self.problem.detail
    }

    /// The full response, once the request id and the public base URL are known.
    pub fn render(&self, request_id: &str, public_base_url: &str) -> Response {
        let bytes = self.problem.render(request_id, public_base_url);
        let mut response = (status_of(self.problem.code), bytes).into_response();
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

/// The HTTP status of a problem code.
pub fn status_of(code: ProblemCode) -> StatusCode {
    StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem.code, self.problem.detail)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    /// Stashes the error for the edge middleware, which renders it with the request's context.
    fn into_response(self) -> Response {
        let mut response = status_of(self.problem.code).into_response();
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
            corrupt @ DomainError::Corrupt(_) => Self::internal(&corrupt),
            sealed @ DomainError::Unsealable(_) => Self::internal(&sealed),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_promised_only_where_a_retry_can_succeed() {
        for code in ProblemCode::ALL {
            let response = ApiError::new(code, "x").render("req_1", "http://x");
            let promised = response.headers().contains_key(header::RETRY_AFTER);
            let retryable = matches!(
                code,
                ProblemCode::IdempotencyKeyInUse
                    | ProblemCode::RateLimited
                    | ProblemCode::ProcessorUnavailable
                    | ProblemCode::ServiceUnavailable
                    | ProblemCode::InternalError
            );
            assert_eq!(promised, retryable, "{code}");
            if code.status() < 500 && !retryable {
                assert!(!promised, "a final {} ({code}) promises nothing", code.status());
            }
        }
    }
}
