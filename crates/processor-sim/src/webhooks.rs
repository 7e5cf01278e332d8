//! The stand-in's webhooks: Stripe-style events (`charge.succeeded`, `charge.failed`,
//! `charge.captured`, `charge.refunded`, and `payment_intent.succeeded`, `.payment_failed`,
//! `.amount_capturable_updated`, `.requires_action`, `.canceled`) posted to one endpoint, signed
//! with `Stripe-Signature` and the endpoint's `whsec_…` secret, delivered at least once.
//!
//! An event is raised by the ledger when an operation changes a charge or a PaymentIntent (a
//! replay raises none), and carries the request's idempotency key (`request.idempotency_key`), as
//! Stripe's do; a change nobody asked for (an authentication completed at the stand-in's test
//! page, or one that expired) carries none. A
//! dispatcher task posts each one; an answer other than 2xx, or none, is retried with exponential
//! back-off up to [`MAX_ATTEMPTS`] times, each attempt signed anew with the current time. Seeded
//! faults, drawn per event from their own generator (the requests' fault sequence is unchanged):
//! a delay before the first attempt, a duplicate delivery, and an event held back until the next
//! one has been sent (out of order). A full `POST /_sim/reset` forgets the events waiting or
//! being retried: each carries the reset epoch it was raised in, and is dropped once that has
//! passed.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payments_backoff::{Backoff, Jitter};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Sim;
use crate::ledger::new_id;
use provider::signature::{STRIPE_SIGNATURE_HEADER, sign};

/// Attempts per delivery before the stand-in gives up on it (Stripe tries for three days).
pub const MAX_ATTEMPTS: u32 = 10;

/// The longest pause between two attempts.
const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// How long an event held back (out of order) waits for a next one to overtake it.
const HOLD_AT_MOST: Duration = Duration::from_millis(500);

/// One attempt's bound, connection included.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Events waiting for the dispatcher at most; more are counted in `webhooks_dropped` and lost,
/// as an outage of the processor's webhook system would lose them (reconciliation still
/// searches).
pub(super) const QUEUE_BOUND: usize = 100_000;

/// The version of the event shape, as Stripe names it on every event.
const API_VERSION: &str = "2024-06-20";

/// Where events go: one endpoint and its signing secret. `PUT /_sim/webhooks`, or the
/// `--webhook-url` and `--webhook-secret` flags.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTarget {
    /// The endpoint, e.g. `http://127.0.0.1:8080/webhooks/processor`.
    pub url: String,
    /// `whsec_…`
    pub secret: String,
}

impl std::fmt::Debug for WebhookTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookTarget").field("url", &self.url).finish_non_exhaustive()
    }
}

impl WebhookTarget {
    /// Checks the URL's scheme and the secret's prefix.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err("the webhook url must be an http or https URL".into());
        }
        if !self.secret.starts_with("whsec_") || self.secret.len() < 12 {
            return Err("the webhook secret must be whsec_ and at least 6 more characters".into());
        }
        Ok(())
    }
}

/// What changed a charge or a PaymentIntent, as an event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EventType {
    /// A charge was made and authorized (captured or not).
    ChargeSucceeded,
    /// A charge was made and declined.
    ChargeFailed,
    /// An authorized charge was captured.
    ChargeCaptured,
    /// A charge was refunded, or its authorization released, in whole or in part.
    ChargeRefunded,
    /// A PaymentIntent's money was taken (confirmed with automatic capture, or captured).
    PaymentIntentSucceeded,
    /// A PaymentIntent's attempt failed (a decline, a failed or expired authentication).
    PaymentIntentPaymentFailed,
    /// A PaymentIntent with manual capture was authorized and can be captured.
    PaymentIntentAmountCapturableUpdated,
    /// A PaymentIntent waits for the customer to authenticate.
    PaymentIntentRequiresAction,
    /// A PaymentIntent was canceled.
    PaymentIntentCanceled,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::ChargeSucceeded => "charge.succeeded",
            Self::ChargeFailed => "charge.failed",
            Self::ChargeCaptured => "charge.captured",
            Self::ChargeRefunded => "charge.refunded",
            Self::PaymentIntentSucceeded => "payment_intent.succeeded",
            Self::PaymentIntentPaymentFailed => "payment_intent.payment_failed",
            Self::PaymentIntentAmountCapturableUpdated => {
                "payment_intent.amount_capturable_updated"
            }
            Self::PaymentIntentRequiresAction => "payment_intent.requires_action",
            Self::PaymentIntentCanceled => "payment_intent.canceled",
        }
    }
}

/// Real unix seconds, for a signature's timestamp: the receiver checks it against its own clock,
/// which the stand-in's test clock does not move.
fn unix_now() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    i64::try_from(now).unwrap_or(i64::MAX)
}

/// The event as Stripe shapes it, around the object (a charge or a PaymentIntent) as it is right
/// after the change; `created` is the unix time on the stand-in's clock, which `POST /_sim/clock`
/// moves as it moves the objects' `created`.
pub(super) fn event(
    kind: EventType,
    object: Value,
    idempotency_key: Option<&str>,
    created: u64,
) -> Value {
    json!({
        "id": new_id("evt"),
        "object": "event",
        "api_version": API_VERSION,
        "created": created,
        "data": {"object": object},
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": Value::Null, "idempotency_key": idempotency_key},
        "type": kind.as_str(),
    })
}

/// The faults one event draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DeliveryPlan {
    /// Before the first attempt.
    pub delay: Duration,
    /// Delivered twice (each copy at least once).
    pub duplicate: bool,
    /// Held back until the next event has been sent.
    pub hold_back: bool,
    /// The first pause between attempts; doubles.
    pub retry_base: Duration,
}

/// Whether events of `epoch` are still to be delivered (no full reset since).
fn current(sim: &Sim, epoch: u64) -> bool {
    sim.lock().webhook_epoch == epoch
}

/// Starts the dispatcher; returns where the ledger's events go, each with its reset epoch.
pub(super) fn start(sim: Sim) -> mpsc::Sender<(u64, Value)> {
    let (sender, receiver) = mpsc::channel(QUEUE_BOUND);
    let http = reqwest::Client::builder()
        .timeout(ATTEMPT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    tokio::spawn(dispatch(sim, receiver, http));
    sender
}

/// Takes events in the order they were raised; sends each on a task of its own (a slow endpoint
/// holds up nothing else), except one that drew "out of order", which waits for the next event
/// to go first (or for [`HOLD_AT_MOST`]).
async fn dispatch(sim: Sim, mut events: mpsc::Receiver<(u64, Value)>, http: reqwest::Client) {
    let send = |(epoch, event): (u64, Value), plan: DeliveryPlan| {
        tokio::spawn(deliver(sim.clone(), http.clone(), epoch, Arc::new(event), plan));
    };
    let mut held: Option<((u64, Value), DeliveryPlan)> = None;
    loop {
        let next = if held.is_some() {
            tokio::time::timeout(HOLD_AT_MOST, events.recv()).await.ok().flatten()
        } else {
            match events.recv().await {
                Some(event) => Some(event),
                None => return,
            }
        };
        let Some(event) = next else {
            // Nothing overtook the held event in time (or nothing more will come): let it go.
            if let Some((event, plan)) = held.take() {
                send(event, plan);
            }
            continue;
        };
        let plan = {
            let mut inner = sim.lock();
            if inner.webhook_epoch != event.0 {
                continue;
            }
            inner.faults.webhook_plan()
        };
        if plan.hold_back && held.is_none() {
            held = Some((event, plan));
            continue;
        }
        send(event, plan);
        if let Some((event, plan)) = held.take() {
            send(event, plan);
        }
    }
}

/// Delivers one event at least once (twice if it drew a duplicate).
async fn deliver(
    sim: Sim,
    http: reqwest::Client,
    epoch: u64,
    event: Arc<Value>,
    plan: DeliveryPlan,
) {
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    if plan.duplicate {
        tokio::spawn(attempts(sim.clone(), http.clone(), epoch, event.clone(), plan.retry_base));
    }
    attempts(sim, http, epoch, event, plan.retry_base).await;
}

/// Posts `event` until a 2xx answer or [`MAX_ATTEMPTS`], to the target in force at each attempt.
async fn attempts(
    sim: Sim,
    http: reqwest::Client,
    epoch: u64,
    event: Arc<Value>,
    retry_base: Duration,
) {
    let body = event.to_string();
    // Deterministic, so that a seeded run repeats: the stand-in draws its faults from its seed.
    let backoff = Backoff::new(retry_base, BACKOFF_CAP, Jitter::None);
    for attempt in 1..=MAX_ATTEMPTS {
        // No endpoint: nothing to deliver to, as at Stripe; a reset since: nothing to deliver.
        if !current(&sim, epoch) {
            return;
        }
        let Some(target) = sim.lock().webhook_target.clone() else { return };
        let signature = sign(&target.secret, unix_now(), body.as_bytes());
        let sent = http
            .post(&target.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json; charset=utf-8")
            .header(reqwest::header::USER_AGENT, "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
            .header(STRIPE_SIGNATURE_HEADER, signature)
            .body(body.clone())
            .send()
            .await;
        let delivered = matches!(&sent, Ok(response) if response.status().is_success());
        {
            let mut inner = sim.lock();
            let stats = &mut inner.ledger.stats;
            stats.webhooks_sent += 1;
            if delivered {
                stats.webhooks_delivered += 1;
            }
        }
        if delivered {
            return;
        }
        tracing::debug!(status = ?sent.as_ref().map(reqwest::Response::status).ok(), "webhook attempt failed; retrying");
        tokio::time::sleep(backoff.delay(attempt)).await;
    }
    sim.lock().ledger.stats.webhooks_abandoned += 1;
}
