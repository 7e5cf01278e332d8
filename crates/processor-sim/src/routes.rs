//! The router, and the handlers of Stripe's API (`/v1`): each reads the request (the API key, the
//! `Idempotency-Key`, the form or the query), hands it to the ledger under the lock, and sends the
//! ledger's [`Answer`]. A POST runs under Stripe's idempotency rules
//! ([`Ledger::idempotent`](crate::ledger::Ledger::idempotent)).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;

use crate::answer::Answer;
use crate::faults::ErrorAfterProcessing;
use crate::ledger::{Ledger, Post};
use crate::middleware::inject_faults;
use crate::{Sim, authentication, control, intent_routes};

/// Stripe's routes behind the fault middleware, and the stand-in's own `/_sim` routes, which
/// draw no faults.
pub(crate) fn router(sim: Sim) -> Router {
    let api = Router::new()
        .route("/v1/charges", post(create_charge).get(list_charges))
        .route("/v1/charges/search", get(search_charges))
        .route("/v1/charges/{id}", get(retrieve_charge))
        .route("/v1/charges/{id}/capture", post(capture_charge))
        .route("/v1/refunds", post(create_refund).get(list_refunds))
        .merge(intent_routes::api())
        .layer(middleware::from_fn_with_state(sim.clone(), inject_faults));
    Router::new()
        .merge(api)
        .merge(authentication::routes())
        .merge(crate::drive::routes())
        .route("/_sim/faults", get(control::get_faults).put(control::put_faults))
        .route("/_sim/stats", get(control::get_stats))
        .route("/_sim/webhooks", get(control::get_webhooks).put(control::put_webhooks))
        .with_state(sim)
}

pub(crate) fn api_key(headers: &HeaderMap) -> Result<String, Answer> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|key| !key.trim().is_empty())
        .map(|key| key.trim().to_owned())
        .ok_or_else(|| {
            Answer::refused(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "api_key_missing",
                None,
                "You did not provide an API key.",
            )
        })
}

/// Answers a read with `read`'s answer if the request carries a key, else with the 401.
pub(crate) fn authorized(headers: &HeaderMap, read: impl FnOnce() -> Answer) -> Response {
    api_key(headers).map_or_else(|refused| refused, |_| read()).into_response()
}

fn idempotency_key(headers: &HeaderMap) -> Option<&str> {
    headers.get("idempotency-key").and_then(|v| v.to_str().ok())
}

fn form(body: &Bytes) -> Result<Vec<(String, String)>, Answer> {
    serde_urlencoded::from_bytes(body).map_err(|_| {
        Answer::refused(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "parameter_invalid",
            None,
            "The body is not form-encoded.",
        )
    })
}

/// Runs a POST under Stripe's idempotency rules (see [`Ledger::idempotent`]).
pub(crate) fn idempotent_post(
    sim: &Sim,
    headers: &HeaderMap,
    fault: Option<Extension<ErrorAfterProcessing>>,
    path: &str,
    body: &Bytes,
    run: impl FnOnce(&mut Ledger, &[(String, String)]) -> Answer,
) -> Response {
    let api_key = match api_key(headers) {
        Ok(key) => key,
        Err(answer) => return answer.into_response(),
    };
    let params = match form(body) {
        Ok(params) => params,
        Err(answer) => return answer.into_response(),
    };
    let mut guard = sim.lock();
    let inner = &mut *guard;
    let post = Post {
        api_key: &api_key,
        key: idempotency_key(headers),
        path,
        params: &params,
        error_after_processing: fault.is_some(),
    };
    let answer = inner.ledger.idempotent(post, inner.faults.config(), run);
    inner.send_events();
    answer.into_response()
}

async fn create_charge(
    State(sim): State<Sim>,
    fault: Option<Extension<ErrorAfterProcessing>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    idempotent_post(&sim, &headers, fault, "/v1/charges", &body, Ledger::create_charge)
}

async fn capture_charge(
    State(sim): State<Sim>,
    fault: Option<Extension<ErrorAfterProcessing>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/v1/charges/{id}/capture");
    idempotent_post(&sim, &headers, fault, &path, &body, |ledger, params| {
        ledger.capture(&id, params)
    })
}

async fn create_refund(
    State(sim): State<Sim>,
    fault: Option<Extension<ErrorAfterProcessing>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    idempotent_post(&sim, &headers, fault, "/v1/refunds", &body, Ledger::create_refund)
}

async fn retrieve_charge(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    authorized(&headers, || sim.lock().ledger.retrieve_charge(&id))
}

/// `limit` and `starting_after`, as Stripe's lists take them.
#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    starting_after: Option<String>,
}

async fn list_charges(
    State(sim): State<Sim>,
    Query(query): Query<ListQuery>,
    headers: HeaderMap,
) -> Response {
    authorized(&headers, || {
        sim.lock().ledger.list_charges(query.limit, query.starting_after.as_deref())
    })
}

/// A refund list's query: a list's, and the charge (or the PaymentIntent) whose refunds to list.
#[derive(Debug, Deserialize)]
struct RefundListQuery {
    charge: Option<String>,
    payment_intent: Option<String>,
    limit: Option<usize>,
    starting_after: Option<String>,
}

async fn list_refunds(
    State(sim): State<Sim>,
    Query(query): Query<RefundListQuery>,
    headers: HeaderMap,
) -> Response {
    authorized(&headers, || {
        let charge = query.charge.as_deref();
        let starting_after = query.starting_after.as_deref();
        let ledger = &sim.lock().ledger;
        match (&query.payment_intent, charge) {
            (Some(intent), None) => {
                ledger.list_refunds_of_intent(intent, query.limit, starting_after)
            }
            _ => ledger.list_refunds(charge, query.limit, starting_after),
        }
    })
}

/// `query`, `limit` and `page`, as Stripe's search takes them (charges' and PaymentIntents').
#[derive(Debug, Deserialize)]
pub(crate) struct SearchQuery {
    pub(crate) query: Option<String>,
    pub(crate) limit: Option<usize>,
    pub(crate) page: Option<String>,
}

async fn search_charges(
    State(sim): State<Sim>,
    Query(query): Query<SearchQuery>,
    headers: HeaderMap,
) -> Response {
    authorized(&headers, || {
        let mut inner = sim.lock();
        let lag_ms = inner.faults.config().search_lag_ms;
        inner.ledger.search_charges(
            query.query.as_deref(),
            query.limit,
            query.page.as_deref(),
            lag_ms,
        )
    })
}
