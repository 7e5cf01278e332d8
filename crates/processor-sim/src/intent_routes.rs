//! The handlers of Stripe's PaymentIntents (`/v1/payment_intents…`), behind the same fault
//! middleware as the charge routes: each POST runs under Stripe's idempotency rules, as a charge
//! does. Before each, authentications that waited past `authentication_ttl_s` fail (the clock is
//! read lazily, as key expiry reads it), so that what a request sees is never stale.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::Sim;
use crate::faults::ErrorAfterProcessing;
use crate::ledger::IntentListQuery;
use crate::routes::{SearchQuery, authorized, idempotent_post};

/// The PaymentIntent routes, to be put behind the fault middleware.
pub(crate) fn api() -> Router<Sim> {
    Router::new()
        .route("/v1/payment_intents", post(create).get(list))
        .route("/v1/payment_intents/search", get(search))
        .route("/v1/payment_intents/{id}", get(retrieve))
        .route("/v1/payment_intents/{id}/confirm", post(confirm))
        .route("/v1/payment_intents/{id}/capture", post(capture))
        .route("/v1/payment_intents/{id}/cancel", post(cancel))
}

/// Fails the authentications that have waited too long, and sends their events.
pub(crate) fn expire_authentications(sim: &Sim) {
    let mut inner = sim.lock();
    let ttl_ms = inner.faults.config().authentication_ttl_ms();
    inner.ledger.expire_authentications(ttl_ms);
    inner.send_events();
}

/// The stand-in's own base URL, as the caller reached it: where `next_action` sends the customer
/// to authenticate.
fn base_url(headers: &HeaderMap) -> String {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    format!("http://{}", host.unwrap_or("127.0.0.1:12111"))
}

async fn create(
    State(sim): State<Sim>,
    fault: Option<Extension<ErrorAfterProcessing>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    expire_authentications(&sim);
    let base = base_url(&headers);
    idempotent_post(&sim, &headers, fault, "/v1/payment_intents", &body, |ledger, params| {
        ledger.create_intent(params, &base)
    })
}

async fn confirm(
    State(sim): State<Sim>,
    fault: Option<Extension<ErrorAfterProcessing>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    expire_authentications(&sim);
    let base = base_url(&headers);
    let path = format!("/v1/payment_intents/{id}/confirm");
    idempotent_post(&sim, &headers, fault, &path, &body, |ledger, params| {
        ledger.confirm_intent(&id, params, &base)
    })
}

async fn capture(
    State(sim): State<Sim>,
    fault: Option<Extension<ErrorAfterProcessing>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    expire_authentications(&sim);
    let path = format!("/v1/payment_intents/{id}/capture");
    idempotent_post(&sim, &headers, fault, &path, &body, |ledger, params| {
        ledger.capture_intent(&id, params)
    })
}

async fn cancel(
    State(sim): State<Sim>,
    fault: Option<Extension<ErrorAfterProcessing>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    expire_authentications(&sim);
    let path = format!("/v1/payment_intents/{id}/cancel");
    idempotent_post(&sim, &headers, fault, &path, &body, |ledger, params| {
        ledger.cancel_intent(&id, params)
    })
}

async fn retrieve(State(sim): State<Sim>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    expire_authentications(&sim);
    authorized(&headers, || sim.lock().ledger.retrieve_intent(&id))
}

async fn list(
    State(sim): State<Sim>,
    Query(query): Query<IntentListQuery>,
    headers: HeaderMap,
) -> Response {
    expire_authentications(&sim);
    authorized(&headers, || sim.lock().ledger.list_intents(&query))
}

async fn search(
    State(sim): State<Sim>,
    Query(query): Query<SearchQuery>,
    headers: HeaderMap,
) -> Response {
    expire_authentications(&sim);
    authorized(&headers, || {
        let mut inner = sim.lock();
        let lag_ms = inner.faults.config().search_lag_ms;
        inner.ledger.search_intents(
            query.query.as_deref(),
            query.limit,
            query.page.as_deref(),
            lag_ms,
        )
    })
}
