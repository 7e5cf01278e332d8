//! Numbers to watch: `GET /metrics` in Prometheus text format, on the admin listener
//! (`crate::admin`), not the public one.
//!
//! - `http_requests_total{method,route,status}` and `http_request_duration_seconds{method,route}`:
//!   by route template (`/v1/payments/{id}`), never by raw path, so ids do not explode the series;
//! - `idempotency_events_total{event}`: claims, replays, 409s, 422s, takeovers, lost leases, …;
//! - `processor_calls_total{operation,outcome}` and `processor_call_duration_seconds` (recorded by
//!   the provider client);
//! - `rate_limited_total`;
//! - `http_write_stalled_connections_total`: connections closed because their client read
//!   nothing for `http.write_timeout_ms` while an answer waited (`write_timeout`).

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem::{Event, Observer};

/// Counts requests and their latency by route.
pub async fn track(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("http_request_duration_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

/// `GET /metrics` on the admin listener.
pub async fn render() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        payments_telemetry::metrics().render(),
    )
        .into_response()
}

/// Turns the engine's events into `idempotency_events_total`.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdemMetrics;

impl Observer for IdemMetrics {
    fn event(&self, event: Event) {
        let name = match event {
            Event::Claimed => "claimed",
            Event::Resumed => "resumed",
            Event::TookOver => "took_over",
            Event::Replayed => "replayed",
            Event::AnsweredFromMemory => "answered_from_memory",
            Event::InUse => "in_use",
            Event::Mismatch => "mismatch",
            Event::LeaseLost => "lease_lost",
            Event::Released => "released",
            Event::Finished => "finished",
            Event::Flagged => "flagged",
            Event::DatabaseRetry => "database_retry",
        };
        metrics::counter!("idempotency_events_total", "event" => name).increment(1);
    }
}
