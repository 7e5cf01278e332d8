//! The stand-in card processor: the subset of Stripe's Charges and Refunds API that the client
//! uses, with real in-memory state, Stripe's idempotency semantics, the test tokens, and seeded
//! fault injection, so that a run can be repeated exactly.
//!
//! By default it is as strict as Stripe ([`Idempotency::Stripe`]): the answer of every request
//! that began executing is kept against its key and replayed with `Idempotent-Replayed: true`
//! (2xx, 402, the 4xx an operation raises, 500s); a key reused with other parameters is
//! `400 idempotency_error`; a key is forgotten after `key_ttl_s`; charges can be found by
//! metadata with `GET /v1/charges/search` (after `search_lag_ms`), and a charge's refunds with
//! `GET /v1/refunds?charge=…`. [`Idempotency::Lenient`] keeps only 2xx and 402, as the stand-in
//! first did.
//!
//! Once told where (`PUT /_sim/webhooks`), it sends Stripe-style webhooks for every change of a
//! charge, signed with `Stripe-Signature`, at least once, with their own seeded faults (see
//! [`webhooks`]).
//!
//! State lives in memory: a restart forgets every charge.

mod clock;
mod faults;
mod idempotency;
mod search;
mod state;
mod webhooks;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use tokio::net::TcpListener;

use clock::Clock;
pub use clock::ManualClock;
pub use faults::{DEFAULT_KEY_TTL_S, FaultConfig, Idempotency};
use faults::{ErrorAfterProcessing, Fault};
pub use state::Stats;
use state::{Answer, Ledger, Post};
pub use webhooks::{MAX_ATTEMPTS as WEBHOOK_MAX_ATTEMPTS, WebhookTarget};

/// The default port, the one Stripe's own mock server uses.
pub const DEFAULT_PORT: u16 = 12111;

#[derive(Debug)]
struct Inner {
    ledger: Ledger,
    faults: faults::Injector,
    /// Where webhook events go; `None`: nowhere (they are not raised).
    webhook_target: Option<WebhookTarget>,
    /// The webhook dispatcher's queue.
    webhook_queue: Option<tokio::sync::mpsc::Sender<serde_json::Value>>,
}

impl Inner {
    /// Hands the events the last operation raised to the webhook dispatcher, if an endpoint is
    /// set (with none, there is no one to tell, as at Stripe).
    fn send_events(&mut self) {
        let events = self.ledger.take_events();
        if self.webhook_target.is_none() {
            return;
        }
        for event in events {
            let queued =
                self.webhook_queue.as_ref().is_some_and(|queue| queue.try_send(event).is_ok());
            if queued {
                self.ledger.stats.events_created += 1;
            } else {
                self.ledger.stats.webhooks_dropped += 1;
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Sim(Arc<Mutex<Inner>>);

impl Sim {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A bound, not yet serving, stand-in processor.
#[derive(Debug)]
pub struct Simulator {
    listener: TcpListener,
    router: Router,
    sim: Sim,
}

impl Simulator {
    /// Binds `address` (port 0 picks a free port) with the given faults in force; its time is
    /// the monotonic clock.
    pub async fn build(address: &str, faults: FaultConfig) -> std::io::Result<Self> {
        Self::build_on(address, faults, Clock::Monotonic(std::time::Instant::now())).await
    }

    /// As [`Simulator::build`], on a clock the caller moves: for tests that cross a key's
    /// lifetime or the search lag without sleeping.
    pub async fn build_with_clock(
        address: &str,
        faults: FaultConfig,
        clock: ManualClock,
    ) -> std::io::Result<Self> {
        Self::build_on(address, faults, Clock::Manual(clock)).await
    }

    async fn build_on(address: &str, faults: FaultConfig, clock: Clock) -> std::io::Result<Self> {
        faults.validate().map_err(std::io::Error::other)?;
        let listener = TcpListener::bind(address).await?;
        let sim = Sim(Arc::new(Mutex::new(Inner {
            ledger: Ledger::new(clock),
            faults: faults::Injector::new(faults),
            webhook_target: None,
            webhook_queue: None,
        })));
        let queue = webhooks::start(sim.clone());
        sim.lock().webhook_queue = Some(queue);
        let api = Router::new()
            .route("/v1/charges", post(create_charge).get(list_charges))
            .route("/v1/charges/search", get(search_charges))
            .route("/v1/charges/{id}", get(retrieve_charge))
            .route("/v1/charges/{id}/capture", post(capture_charge))
            .route("/v1/refunds", post(create_refund).get(list_refunds))
            .layer(middleware::from_fn_with_state(sim.clone(), inject_faults));
        let router = Router::new()
            .merge(api)
            .route("/_sim/faults", get(get_faults).put(put_faults))
            .route("/_sim/stats", get(get_stats))
            .route("/_sim/webhooks", get(get_webhooks).put(put_webhooks))
            .with_state(sim.clone());
        Ok(Self { listener, router, sim })
    }

    /// Sends webhook events to `target` from now on (`None`: to nobody), as
    /// `PUT /_sim/webhooks` does.
    pub fn set_webhook_target(&self, target: Option<WebhookTarget>) -> Result<(), String> {
        if let Some(target) = &target {
            target.validate()?;
        }
        self.sim.lock().webhook_target = target;
        Ok(())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Serves until `stop` completes.
    pub async fn run_until(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.router).with_graceful_shutdown(stop).await
    }
}

/// Applies the fault plan of this request: delay, then drop, fail, or answer with nothing; and
/// names every answer with a `Request-Id`, as Stripe does.
async fn inject_faults(State(sim): State<Sim>, request: Request, next: Next) -> Response {
    let (fault, delay, number) = {
        let mut inner = sim.lock();
        inner.ledger.stats.requests += 1;
        let (mut fault, delay) = inner.faults.plan();
        // "500 after processing" is a fault of requests that act: a read has nothing to act on,
        // and is answered as usual (the draw is made all the same, to keep the sequence).
        if fault == Fault::ErrorAfterProcessing && request.method() != Method::POST {
            fault = Fault::None;
        }
        if fault != Fault::None {
            inner.ledger.stats.faults_injected += 1;
        }
        (fault, delay, inner.ledger.stats.requests)
    };
    let mut response = faulted(fault, delay, request, next).await;
    if let Ok(id) = HeaderValue::from_str(&format!("req_{number:014}")) {
        response.headers_mut().insert("request-id", id);
    }
    response
}

/// Carries out one fault plan around the request.
async fn faulted(fault: Fault, delay: Duration, mut request: Request, next: Next) -> Response {
    match fault {
        Fault::ErrorAfterProcessing => {
            // The POST executes and its handler answers the 500 (and keeps it against the key).
            request.extensions_mut().insert(ErrorAfterProcessing);
            let response = processed(request, next).await;
            pause(delay).await;
            response
        }
        Fault::None | Fault::LostResponse => {
            let response = processed(request, next).await;
            pause(delay).await;
            if fault == Fault::LostResponse { broken_answer() } else { response }
        }
        Fault::Drop => {
            pause(delay).await;
            broken_answer()
        }
        Fault::ServerError => {
            pause(delay).await;
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                None,
                "An injected processor error.",
            )
        }
        Fault::RateLimit => {
            pause(delay).await;
            let mut response = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                "Too many requests (injected).",
            );
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// Runs the request to the end, as at a real processor, even if the caller stops waiting: the
/// latency is in the answer's way back. So a caller that times out does not know whether the
/// charge happened; it did.
async fn processed(request: Request, next: Next) -> Response {
    match tokio::spawn(next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", None, "The processor failed.")
        }
    }
}

async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// A response whose body fails at once: the connection breaks off, as if it had been reset.
fn broken_answer() -> Response {
    let stream = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by fault injection"))
    });
    Response::new(Body::from_stream(stream))
}

fn error(status: StatusCode, type_: &str, code: Option<&str>, message: &str) -> Response {
    let mut body = serde_json::json!({"error": {"type": type_, "message": message}});
    if let Some(code) = code {
        body["error"]["code"] = code.into();
    }
    (status, Json(body)).into_response()
}

fn api_key(headers: &HeaderMap) -> Result<String, Answer> {
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
fn authorized(headers: &HeaderMap, read: impl FnOnce() -> Answer) -> Response {
    into_response(api_key(headers).map_or_else(|refused| refused, |_| read()))
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

fn into_response(answer: Answer) -> Response {
    let mut response = (answer.status, Json(answer.body)).into_response();
    if answer.replayed {
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if answer.kept && answer.status.is_server_error() {
        // What Stripe tells its SDKs about a 500 its idempotency layer will replay: a retry
        // with the same key gets the same 500.
        response.headers_mut().insert("stripe-should-retry", HeaderValue::from_static("false"));
    }
    response
}

/// Runs a POST under Stripe's idempotency rules (see [`Ledger::idempotent`]).
fn idempotent_post(
    sim: &Sim,
    headers: &HeaderMap,
    fault: Option<Extension<ErrorAfterProcessing>>,
    path: &str,
    body: &Bytes,
    run: impl FnOnce(&mut Ledger, &[(String, String)]) -> Answer,
) -> Response {
    let api_key = match api_key(headers) {
        Ok(key) => key,
        Err(answer) => return into_response(answer),
    };
    let params = match form(body) {
        Ok(params) => params,
        Err(answer) => return into_response(answer),
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
    into_response(answer)
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

/// A refund list's query: a list's, and the charge whose refunds to list.
#[derive(Debug, Deserialize)]
struct RefundListQuery {
    charge: Option<String>,
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
        sim.lock().ledger.list_refunds(charge, query.limit, query.starting_after.as_deref())
    })
}

/// `query`, `limit` and `page`, as Stripe's search takes them.
#[derive(Debug, Deserialize)]
struct SearchQuery {
    query: Option<String>,
    limit: Option<usize>,
    page: Option<String>,
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

async fn get_faults(State(sim): State<Sim>) -> Json<FaultConfig> {
    Json(sim.lock().faults.config().clone())
}

async fn put_faults(State(sim): State<Sim>, body: Bytes) -> Response {
    let config: FaultConfig = match serde_json::from_slice(&body) {
        Ok(config) => config,
        Err(err) => {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", None, &err.to_string());
        }
    };
    if let Err(message) = config.validate() {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", None, &message);
    }
    let mut inner = sim.lock();
    inner.faults = faults::Injector::new(config);
    Json(inner.faults.config().clone()).into_response()
}

/// `GET /_sim/webhooks`: the endpoint events go to (its secret is not shown).
async fn get_webhooks(State(sim): State<Sim>) -> Json<serde_json::Value> {
    let url = sim.lock().webhook_target.as_ref().map(|target| target.url.clone());
    Json(serde_json::json!({ "url": url }))
}

/// `PUT /_sim/webhooks` with `{"url": …, "secret": "whsec_…"}`, or `null` (or nothing) to send
/// none.
async fn put_webhooks(State(sim): State<Sim>, body: Bytes) -> Response {
    let parsed = match body.trim_ascii() {
        [] => Ok(None),
        json => serde_json::from_slice(json),
    };
    let target: Option<WebhookTarget> = match parsed {
        Ok(target) => target,
        Err(err) => {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", None, &err.to_string());
        }
    };
    if let Some(Err(message)) = target.as_ref().map(WebhookTarget::validate) {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", None, &message);
    }
    let url = target.as_ref().map(|target| target.url.clone());
    sim.lock().webhook_target = target;
    Json(serde_json::json!({ "url": url })).into_response()
}

async fn get_stats(State(sim): State<Sim>) -> Json<Stats> {
    Json(sim.lock().ledger.stats.clone())
}

/// How long a request may be held by latency injection at the most, so a typo cannot hang a test
/// run for hours.
pub const MAX_LATENCY: Duration = Duration::from_secs(60);
