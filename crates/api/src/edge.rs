//! The HTTP edge: what wraps every request, whatever its route.
//!
//! From the outside in: a request id (`Request-Id: req_…` on every response, and a field of the
//! request's tracing span), problem rendering (an `ApiError` stashed by a handler or extractor
//! becomes an RFC 9457 body with that request id), the declared-size check (413 before anything
//! reads the body), redaction of `Authorization` in logs, the request span and access log, and
//! panic recovery (a panic answers 500 `internal_error`; the process stays up).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;
use tracing::{Level, Span};

use crate::error::{ApiError, ProblemCode};

/// The response header that names the request.
pub static REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("request-id");

/// The id of one HTTP request, `req_…`, in the request's extensions.
#[derive(Debug, Clone)]
pub struct RequestId(Arc<str>);

impl RequestId {
    fn generate() -> Self {
        Self(payments_domain::ids::new_id("req").into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the edge needs to know.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Base of problem `type` URLs, without a trailing slash.
    pub public_base_url: Arc<str>,
    /// Largest accepted body.
    pub body_limit_bytes: usize,
}

/// Wraps a router in the edge layers.
pub fn wrap(router: Router, config: EdgeConfig) -> Router {
    let limit = config.body_limit_bytes;
    // `Router::layer` wraps what is already there, so the last layer added is the outermost.
    router
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .layer(CatchPanicLayer::custom(answer_panic))
        .layer(TraceLayer::new_for_http().make_span_with(request_span).on_request(()).on_response(
            |response: &Response, latency: Duration, _: &Span| {
                tracing::info!(
                    status = response.status().as_u16(),
                    latency_ms = latency.as_secs_f64() * 1000.0,
                    "answered"
                );
            },
        ))
        .layer(SetSensitiveRequestHeadersLayer::new([header::AUTHORIZATION]))
        .layer(middleware::from_fn_with_state(config, request_id_and_problems))
}

async fn request_id_and_problems(
    State(config): State<EdgeConfig>,
    mut request: Request,
    next: Next,
) -> Response {
    let request_id = RequestId::generate();
    request.extensions_mut().insert(request_id.clone());

    let mut response = match declared_length(&request) {
        Some(length) if length > config.body_limit_bytes as u64 => ApiError::new(
            ProblemCode::PayloadTooLarge,
            format!(
                "The request body is {length} bytes; the limit is {} bytes.",
                config.body_limit_bytes
            ),
        )
        .into_response(),
        _ => next.run(request).await,
    };

    if let Some(error) = response.extensions_mut().remove::<ApiError>() {
        response = error.render(request_id.as_str(), &config.public_base_url);
    }
    if let Ok(value) = HeaderValue::from_str(request_id.as_str()) {
        response.headers_mut().insert(REQUEST_ID_HEADER.clone(), value);
    }
    response
}

fn declared_length(request: &Request) -> Option<u64> {
    request.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

fn request_span(request: &Request) -> Span {
    let request_id = request.extensions().get::<RequestId>().map(RequestId::as_str).unwrap_or("");
    tracing::span!(
        Level::INFO,
        "request",
        request_id,
        method = %request.method(),
        path = request.uri().path(),
        account_id = tracing::field::Empty,
    )
}

fn answer_panic(panic: Box<dyn Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    tracing::error!(panic = message, "a handler panicked");
    ApiError::new(
        ProblemCode::InternalError,
        "An unexpected error occurred. Retry the request; with the same Idempotency-Key it resumes where it stopped.",
    )
    .into_response()
}
