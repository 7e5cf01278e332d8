//! The HTTP edge: what wraps every request, whatever its route.
//!
//! From the outside in: a request id (`Request-Id: req_…` on every response, and a field of the
//! request's tracing span), the client's address (`limits::ClientAddress`: the peer, or the client
//! a trusted proxy names; a field of the span too, and what the per-address limit counts), problem
//! rendering (an `ApiError` stashed by a handler or extractor
//! becomes an RFC 9457 body with that request id), the declared-size check (413 before anything
//! reads the body), redaction of `Authorization` in logs, the request span and access log, and
//! panic recovery (a panic answers 500 `internal_error`; the process stays up).
//!
//! Every request holds a place among those in flight (`http.max_in_flight_requests`) from the
//! edge until its answer is ready ([`InFlight`]): the bound protects the work that callers may
//! ask for. A body is read outside it, under a total deadline (`http.body_deadline_ms`), so that
//! bodies that trickle in hold no place; and each account holds at most its own share of the
//! places (`rate_limit.account_in_flight`).

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};
use tower_http::trace::TraceLayer;
use tracing::{Level, Span};

use crate::error::{ApiError, ProblemCode};
use crate::limits::{ClientAddress, InFlight, ProxyTrust};

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
    /// Bounds on slow clients and on load.
    pub limits: EdgeLimits,
    /// Which peers may name the client a request comes from.
    pub proxies: Arc<ProxyTrust>,
}

/// How long a request may take and how many run at once.
#[derive(Debug, Clone)]
pub struct EdgeLimits {
    /// Longest pause between two pieces of a body.
    pub body_timeout: Duration,
    /// Longest a whole request may take.
    pub request_timeout: Duration,
    /// Requests in flight; a request beyond them is answered 503 at once. Shared by every
    /// clone of the config (one per router), so it counts the whole server.
    pub in_flight: Arc<Semaphore>,
    /// Longest a whole request body may take to arrive, read outside the places in flight.
    pub body_deadline: Duration,
}

impl EdgeLimits {
    /// Limits that never bind, for tests of other layers.
    pub fn unbounded() -> Self {
        Self {
            body_timeout: Duration::from_secs(3600),
            request_timeout: Duration::from_secs(3600),
            in_flight: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            body_deadline: Duration::from_secs(3600),
        }
    }
}

/// Wraps a router in the edge layers.
pub fn wrap(router: Router, config: EdgeConfig) -> Router {
    let limit = config.body_limit_bytes;
    let limits = config.limits.clone();
    // `Router::layer` wraps what is already there, so the last layer added is the outermost.
    router
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        // A body that stalls fails its read (a 400 that closes the connection) instead of
        // holding a task and a connection for ever.
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        // Inside the problem renderer, so that the timeout's bare 503 becomes a problem.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            limits.request_timeout,
        ))
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
    // Once per request, before anything counts it against its address.
    if let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>() {
        let client = config.proxies.client_address(peer.ip(), request.headers());
        request.extensions_mut().insert(client);
    }

    // Held until the answer is ready; none left means the server is full, and a quick 503 with
    // Retry-After serves everyone better than a queue that grows until requests time out.
    let place = InFlight::take(config.limits.in_flight.clone(), config.limits.body_deadline);
    let mut response = match (&place, declared_length(&request)) {
        (Err(shed), _) => shed.clone().into_response(),
        (Ok(_), Some(length)) if length > config.body_limit_bytes as u64 => ApiError::new(
            ProblemCode::PayloadTooLarge,
            format!(
                "The request body is {length} bytes; the limit is {} bytes.",
                config.body_limit_bytes
            ),
        )
        .into_response(),
        (Ok(place), _) => {
            request.extensions_mut().insert(place.clone());
            next.run(request).await
        }
    };
    // Given back now, even if something the request started still holds a copy of it.
    if let Ok(place) = place {
        place.give_back();
    }

    if let Some(error) = response.extensions_mut().remove::<ApiError>() {
        response = error.render(request_id.as_str(), &config.public_base_url);
    } else if let Some(error) = framework_error(&response) {
        response = error.render(request_id.as_str(), &config.public_base_url);
    }
    // Answers are per account and per moment: no cache on the way may keep one.
    response
        .headers_mut()
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    if let Ok(value) = HeaderValue::from_str(request_id.as_str()) {
        response.headers_mut().insert(REQUEST_ID_HEADER.clone(), value);
    }
    response
}

/// An error answered by a layer or extractor of the framework in plain text (a rejection the
/// app could not wrap), as the problem of the same status. Bodies that are already problems or
/// JSON (stored answers, replays) are left as they are.
fn framework_error(response: &Response) -> Option<ApiError> {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return None;
    }
    let content_type = response.headers().get(header::CONTENT_TYPE).map(HeaderValue::as_bytes);
    if content_type.is_some_and(|value| value.starts_with(b"application/")) {
        return None;
    }
    let code = match status.as_u16() {
        400 => ProblemCode::InvalidRequest,
        404 => ProblemCode::ResourceMissing,
        405 => ProblemCode::MethodNotAllowed,
        413 => ProblemCode::PayloadTooLarge,
        415 => ProblemCode::UnsupportedMediaType,
        503 => ProblemCode::ServiceUnavailable,
        500 => ProblemCode::InternalError,
        _ => return None,
    };
    let detail = match code {
        ProblemCode::InternalError => "An unexpected error occurred. Retry the request.",
        ProblemCode::ServiceUnavailable => {
            "The server is busy. Retry after the number of seconds in Retry-After."
        }
        _ => "The request could not be read.",
    };
    Some(ApiError::new(code, detail))
}

fn declared_length(request: &Request) -> Option<u64> {
    request.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

fn request_span(request: &Request) -> Span {
    let request_id = request.extensions().get::<RequestId>().map(RequestId::as_str).unwrap_or("");
    let span = tracing::span!(
        Level::INFO,
        "request",
        request_id,
        method = %request.method(),
        path = request.uri().path(),
        client = tracing::field::Empty,
        account_id = tracing::field::Empty,
    );
    if let Some(client) = request.extensions().get::<ClientAddress>() {
        span.record("client", tracing::field::display(client));
    }
    span
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
