//! The stand-in's own surface, outside Stripe's API and its faults: `/_sim/faults` (the
//! [`FaultConfig`] in force, read and replaced at run time), `/_sim/webhooks` (where events go)
//! and `/_sim/stats` (the counters).

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::Sim;
use crate::answer::plain_error;
use crate::faults::{FaultConfig, Injector};
use crate::ledger::Stats;
use crate::webhooks::WebhookTarget;

/// `GET /_sim/faults`: the document in force.
pub(crate) async fn get_faults(State(sim): State<Sim>) -> Json<FaultConfig> {
    Json(sim.lock().faults.config().clone())
}

/// `PUT /_sim/faults`: replaces the whole document (a member left out takes its default) and
/// restarts the fault sequence from its seed.
pub(crate) async fn put_faults(State(sim): State<Sim>, body: Bytes) -> Response {
    let config: FaultConfig = match serde_json::from_slice(&body) {
        Ok(config) => config,
        Err(err) => return invalid(&err.to_string()),
    };
    if let Err(message) = config.validate() {
        return invalid(&message);
    }
    let mut inner = sim.lock();
    inner.faults = Injector::new(config);
    Json(inner.faults.config().clone()).into_response()
}

/// `GET /_sim/webhooks`: the endpoint events go to (its secret is not shown).
pub(crate) async fn get_webhooks(State(sim): State<Sim>) -> Json<serde_json::Value> {
    let url = sim.lock().webhook_target.as_ref().map(|target| target.url.clone());
    Json(serde_json::json!({ "url": url }))
}

/// `PUT /_sim/webhooks` with `{"url": …, "secret": "whsec_…"}`, or `null` (or nothing) to send
/// none.
pub(crate) async fn put_webhooks(State(sim): State<Sim>, body: Bytes) -> Response {
    let parsed = match body.trim_ascii() {
        [] => Ok(None),
        json => serde_json::from_slice(json),
    };
    let target: Option<WebhookTarget> = match parsed {
        Ok(target) => target,
        Err(err) => return invalid(&err.to_string()),
    };
    if let Some(Err(message)) = target.as_ref().map(WebhookTarget::validate) {
        return invalid(&message);
    }
    let url = target.as_ref().map(|target| target.url.clone());
    sim.lock().webhook_target = target;
    Json(serde_json::json!({ "url": url })).into_response()
}

/// `GET /_sim/stats`: the counters.
pub(crate) async fn get_stats(State(sim): State<Sim>) -> Json<Stats> {
    Json(sim.lock().ledger.stats.clone())
}

/// A document the stand-in cannot take: `400 invalid_request_error` with the reason.
fn invalid(message: &str) -> Response {
    plain_error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}
