//! The routes that let another test suite, in any language, drive the stand-in over HTTP, outside
//! Stripe's API and its faults: `GET /healthz`, `POST /_sim/reset`, the aimed faults of
//! `/_sim/faults/aimed` (see `aimed`) and the test clock of `/_sim/clock`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Sim;
use crate::aimed::AimedRule;
use crate::answer::plain_error;
use crate::faults::Injector;

/// The longest `POST /_sim/clock` may move the time in one call: ten years.
const MAX_ADVANCE_S: u64 = 10 * 366 * 24 * 60 * 60;

/// The routes, to merge into the router before its state is given.
pub(crate) fn routes() -> Router<Sim> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/_sim/reset", post(reset))
        .route("/_sim/faults/aimed", get(list_aimed).post(add_aimed).delete(clear_aimed))
        .route("/_sim/clock", get(read_clock).post(advance_clock))
}

/// `GET /healthz`: `{"status":"ok"}` once the stand-in serves. No key, no faults.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// What `POST /_sim/reset` is told to forget.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Reset {
    /// Only the objects, kept keys and aimed rules of this secret key.
    api_key: Option<String>,
    /// A full reset also forgets where webhooks go (they keep going there unless told).
    webhook_target: bool,
}

/// `POST /_sim/reset`. With no body or `{}`: forgets every object (PaymentIntents and their
/// pending authentications included), kept idempotency result, counter, aimed rule and webhook
/// not yet delivered, restores the faults document it started
/// with (and its seeded sequence) and takes back the clock's advances; the webhook target is kept
/// unless `{"webhook_target": true}`. With `{"api_key": "sk_test_…"}`: forgets only what that
/// key made (charges, refunds, PaymentIntents with their pending authentications, kept keys,
/// rules aimed at it), so suites sharing a stand-in with their own
/// keys reset their own. Answers how many of each it forgot.
async fn reset(State(sim): State<Sim>, body: Bytes) -> Response {
    let reset: Reset = match document(&body) {
        Ok(reset) => reset.unwrap_or_default(),
        Err(message) => return invalid(&message),
    };
    let mut inner = sim.lock();
    let (scope, ledger, aimed) = match reset.api_key.as_deref() {
        Some("") => return invalid("api_key must not be empty"),
        Some(_) if reset.webhook_target => {
            return invalid(
                "the webhook target is the stand-in's, not an account's: reset it alone",
            );
        }
        Some(api_key) => {
            let ledger = inner.ledger.forget_account(api_key);
            ("api_key", ledger, inner.aimed.forget_account(api_key))
        }
        None => {
            let ledger = inner.ledger.forget_everything();
            let aimed = inner.aimed.clear();
            inner.faults = Injector::new(inner.initial_faults.clone());
            inner.webhook_epoch += 1;
            if reset.webhook_target {
                inner.webhook_target = None;
            }
            ("all", ledger, aimed)
        }
    };
    let mut removed = serde_json::to_value(ledger).unwrap_or_else(|_| json!({}));
    removed["aimed_faults"] = aimed.into();
    let webhook_url = inner.webhook_target.as_ref().map(|target| target.url.clone());
    Json(json!({"scope": scope, "removed": removed, "webhook_url": webhook_url})).into_response()
}

/// `GET /_sim/faults/aimed`: the live rules, oldest first, each with `fired` and `remaining`.
async fn list_aimed(State(sim): State<Sim>) -> Json<Value> {
    let inner = sim.lock();
    Json(json!({"object": "list", "data": inner.aimed.live()}))
}

/// `POST /_sim/faults/aimed`: adds a rule after the others; answers it as live, with its id.
async fn add_aimed(State(sim): State<Sim>, body: Bytes) -> Response {
    let rule: AimedRule = match document(&body) {
        Ok(Some(rule)) => rule,
        Ok(None) => return invalid("a rule is a JSON object with at least a fault"),
        Err(message) => return invalid(&message),
    };
    match sim.lock().aimed.add(rule) {
        Ok(live) => Json(live).into_response(),
        Err(message) => invalid(&message),
    }
}

/// `DELETE /_sim/faults/aimed`: forgets every rule; answers how many were live.
async fn clear_aimed(State(sim): State<Sim>) -> Json<Value> {
    Json(json!({"removed": sim.lock().aimed.clear()}))
}

/// How far `POST /_sim/clock` moves the time; the two add up.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Advance {
    advance_s: u64,
    advance_ms: u64,
}

/// `GET /_sim/clock`: the time as the stand-in sees it.
async fn read_clock(State(sim): State<Sim>) -> Json<Value> {
    Json(clock(&sim))
}

/// `POST /_sim/clock` with `{"advance_s": 3600}` (or `advance_ms`): moves the stand-in's time
/// forward (key expiry, authentication expiry, the search lag, the `created` of objects and
/// webhook events), never back; answers the time after.
async fn advance_clock(State(sim): State<Sim>, body: Bytes) -> Response {
    let advance: Advance = match document(&body) {
        Ok(advance) => advance.unwrap_or_default(),
        Err(message) => return invalid(&message),
    };
    let by_ms =
        advance.advance_s.checked_mul(1000).and_then(|ms| ms.checked_add(advance.advance_ms));
    match by_ms {
        Some(by_ms) if by_ms <= MAX_ADVANCE_S * 1000 => {
            sim.lock().ledger.clock_mut().advance(by_ms);
            Json(clock(&sim)).into_response()
        }
        _ => invalid(&format!("the clock moves at most {MAX_ADVANCE_S} s at a time")),
    }
}

/// `{"now": unix seconds, "advanced_ms": what POST /_sim/clock added}`.
fn clock(sim: &Sim) -> Value {
    let inner = sim.lock();
    let clock = inner.ledger.clock();
    json!({"now": clock.unix_now_s(), "advanced_ms": clock.offset_ms()})
}

/// A JSON document, or `None` for an empty body; the error is the message of a `400`.
fn document<T: DeserializeOwned>(body: &Bytes) -> Result<Option<T>, String> {
    match body.trim_ascii() {
        [] => Ok(None),
        json => serde_json::from_slice(json).map(Some).map_err(|err| err.to_string()),
    }
}

/// A document the stand-in cannot take: `400 invalid_request_error` with the reason.
fn invalid(message: &str) -> Response {
    plain_error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}
