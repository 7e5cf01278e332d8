//! The stand-in's 3-D Secure test page, as Stripe's hosted one behaves, outside Stripe's API and
//! its faults:
//!
//! - `POST /_sim/payment_intents/{id}/authenticate` with `{"outcome": "complete"}` or
//!   `{"outcome": "fail"}`: what a test calls; answers the PaymentIntent (`400
//!   payment_intent_unexpected_state` if it is not in `requires_action`, 404 if unknown).
//! - `GET /_sim/authenticate/{id}`: where `next_action` sends the customer; a small page with a
//!   Complete and a Fail button, which post `outcome=…` to `POST /_sim/authenticate/{id}`; that
//!   sends the customer on to the intent's `return_url`, as Stripe does.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::Sim;
use crate::answer::plain_error;
use crate::intent_routes::expire_authentications;
use crate::ledger::AuthenticationOutcome;

/// The control routes of the authentication page.
pub(crate) fn routes() -> Router<Sim> {
    Router::new()
        .route("/_sim/payment_intents/{id}/authenticate", post(authenticate))
        .route("/_sim/authenticate/{id}", get(page).post(authenticate_form))
}

/// The body of either form of the route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Authentication {
    outcome: AuthenticationOutcome,
}

/// Ends the authentication of `id` as `outcome`, sends the events; the ledger's answer.
fn run(sim: &Sim, id: &str, outcome: AuthenticationOutcome) -> crate::answer::Answer {
    expire_authentications(sim);
    let mut inner = sim.lock();
    let answer = inner.ledger.authenticate_intent(id, outcome);
    inner.send_events();
    answer
}

async fn authenticate(State(sim): State<Sim>, Path(id): Path<String>, body: Bytes) -> Response {
    match serde_json::from_slice::<Authentication>(&body) {
        Ok(Authentication { outcome }) => run(&sim, &id, outcome).into_response(),
        Err(err) => plain_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!("expected {{\"outcome\": \"complete\"}} or {{\"outcome\": \"fail\"}}: {err}"),
        ),
    }
}

async fn authenticate_form(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let Ok(Authentication { outcome }) = serde_urlencoded::from_bytes(&body) else {
        return (StatusCode::BAD_REQUEST, page_of("Choose Complete or Fail.", None))
            .into_response();
    };
    let answer = run(&sim, &id, outcome);
    let status = answer.body["status"].as_str().unwrap_or_default().to_owned();
    if !answer.status.is_success() {
        let message = answer.body["error"]["message"].as_str().unwrap_or("Unknown PaymentIntent.");
        return (answer.status, page_of(message, None)).into_response();
    }
    match sim.lock().ledger.authentication_return(&id) {
        Some(url) => (StatusCode::SEE_OTHER, [(header::LOCATION, url)]).into_response(),
        None => page_of(&format!("Done: the PaymentIntent is now {status}."), None).into_response(),
    }
}

async fn page(State(sim): State<Sim>, Path(id): Path<String>) -> Response {
    expire_authentications(&sim);
    let intent = sim.lock().ledger.retrieve_intent(&id);
    if !intent.status.is_success() {
        return (StatusCode::NOT_FOUND, page_of("No such PaymentIntent.", None)).into_response();
    }
    let intent = &intent.body;
    if intent["status"] != "requires_action" {
        let message = format!(
            "This PaymentIntent is not awaiting authentication (its status is {}).",
            intent["status"].as_str().unwrap_or_default()
        );
        return page_of(&message, None).into_response();
    }
    let amount = format!(
        "{} {}",
        intent["amount"],
        intent["currency"].as_str().unwrap_or_default().to_uppercase()
    );
    page_of(&format!("Authenticate a payment of {amount} (minor units)."), Some(&id))
        .into_response()
}

/// The page: a message and, for an intent awaiting authentication, the two buttons. Nothing
/// the caller wrote is shown but the intent's id, which the route found in the books.
fn page_of(message: &str, buttons_for: Option<&str>) -> Html<String> {
    let message = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let buttons = buttons_for.map_or_else(String::new, |id| {
        let form = |outcome: &str, label: &str| {
            format!(
                "<form method=\"post\" action=\"/_sim/authenticate/{id}\">\
                 <input type=\"hidden\" name=\"outcome\" value=\"{outcome}\">\
                 <button type=\"submit\">{label}</button></form>"
            )
        };
        format!("{}{}", form("complete", "Complete"), form("fail", "Fail"))
    });
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>3D Secure test page</title>\
         </head><body><h1>3D Secure test page</h1><p>{message}</p>{buttons}</body></html>"
    ))
}
