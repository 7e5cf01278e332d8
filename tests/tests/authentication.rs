//! Payments whose outcome arrives after the request is over (3-D Secure), end to end against the
//! stand-in: a card that needs authentication leaves the payment `requires_action` with where to
//! send the customer, and its key replays that first answer byte for byte whatever happens next;
//! the outcome is recorded once, with one event and one delivery per endpoint, whether the
//! processor's webhook brings it or, with the webhooks off, the worker's authentication job asks;
//! a failed authentication fails the payment, one never completed is canceled when it expires;
//! duplicate, stale and out-of-order events change nothing; capture and cancel of a payment that
//! still waits are refused with their own code.

use std::sync::Arc;
use std::time::Duration;

use payments_tests::{TestApp, assert_problem, json, start_sim, test_settings};
use payments_worker::Worker;
use payments_worker::jobs::LogMailer;
use processor_sim::FaultConfig;
use provider::ProcessorClient;
use provider::signature;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;

/// The endpoint secret the stand-in signs with and the API verifies with.
const SECRET: &str = "whsec_later_outcomes";

/// The 3-D Secure 2 test card: every payment with it waits on its customer.
const THREE_DS: &str = "pm_card_threeDSecure2Required";

struct Setup {
    app: TestApp,
    sim: String,
    key: String,
    http: reqwest::Client,
    settings: Vec<(&'static str, String)>,
}

/// The API with a webhook endpoint of its account's, and a stand-in that sends its webhooks to
/// the API when `webhooks` (else to nobody: they are lost for good); `overrides` are settings of
/// both the API and the worker.
async fn setup(pool: &PgPool, webhooks: bool, overrides: &[(&'static str, &str)]) -> Setup {
    let sim = start_sim(FaultConfig::default()).await;
    let mut settings = vec![
        ("PAYMENTS__PROCESSOR__BASE_URL", sim.clone()),
        ("PAYMENTS__PROCESSOR__WEBHOOK_SECRET", SECRET.to_owned()),
    ];
    settings.extend(overrides.iter().map(|(name, value)| (*name, (*value).to_owned())));
    let borrowed: Vec<(&str, &str)> = settings.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let app = TestApp::spawn_with(pool.clone(), pool.clone(), &borrowed).await;
    let http = reqwest::Client::new();
    if webhooks {
        let target = json!({"url": app.url("/webhooks/processor"), "secret": SECRET});
        let set = http.put(format!("{sim}/_sim/webhooks")).json(&target).send().await.unwrap();
        assert_eq!(set.status(), 200, "the stand-in takes the webhook target");
    }
    let (_, key) = app.create_account("shop").await;
    let endpoint = json!({"url": "https://hooks.example.com/shop", "enabled_events": ["*"]});
    let made = app.post("/v1/webhook_endpoints", &key, None, &endpoint).await;
    assert_eq!(made.status(), 201);
    Setup { app, sim, key, http, settings }
}

impl Setup {
    /// `POST /v1/payments` with the 3-D Secure card under `idem`; its raw answer.
    async fn pay(&self, idem: &str, capture_method: &str) -> reqwest::Response {
        let body = json!({"amount": 700, "currency": "usd", "payment_method": THREE_DS,
                          "capture_method": capture_method});
        self.app.post("/v1/payments", &self.key, Some(idem), &body).await
    }

    async fn payment(&self, id: &str) -> Value {
        json(self.app.get(&format!("/v1/payments/{id}"), &self.key).await).await
    }

    /// Completes or fails the customer's authentication at the stand-in, as its test page does.
    async fn authenticate(&self, intent: &str, outcome: &str) {
        let url = format!("{}/_sim/payment_intents/{intent}/authenticate", self.sim);
        let done = self.http.post(url).json(&json!({"outcome": outcome})).send().await.unwrap();
        assert_eq!(done.status(), 200, "{}", done.text().await.unwrap());
    }

    async fn stats(&self) -> Value {
        json(self.http.get(format!("{}/_sim/stats", self.sim)).send().await.unwrap()).await
    }

    /// One pass of a worker with this setup's settings (its job runner among the rest).
    async fn worker_pass(&self) {
        let borrowed: Vec<(&str, &str)> =
            self.settings.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let settings = test_settings(&borrowed);
        let processor = ProcessorClient::new(settings.processor.client_config()).unwrap();
        let (pool, base) = (self.app.pool.clone(), self.app.address.as_str().into());
        let worker =
            Worker::new(pool, Arc::new(processor), base, &settings, Arc::new(LogMailer)).unwrap();
        let (_stop_tx, stop) = watch::channel(false);
        worker.run_once(&stop).await.expect("a worker pass");
    }

    /// Waits (at most ten seconds) until the payment `id` is `status`.
    async fn until_status(&self, id: &str, status: &str) -> Value {
        for _ in 0..200 {
            let payment = self.payment(id).await;
            if payment["status"] == status {
                return payment;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{id} never came to {status}: {}", self.payment(id).await);
    }
}

async fn count(pool: &PgPool, sql: &str, id: &str) -> i64 {
    sqlx::query_scalar(sql).bind(id).fetch_one(pool).await.expect(sql)
}

/// The events of payment `id`, by type, in order.
async fn events(pool: &PgPool, id: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT type FROM events WHERE object->>'id' = $1 ORDER BY seq")
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// How many webhook deliveries the events of payment `id` staged.
async fn deliveries(pool: &PgPool, id: &str) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM jobs j JOIN events e ON j.dedupe_key LIKE e.id || ':%' \
          WHERE j.kind = 'webhook' AND e.object->>'id' = $1",
        id,
    )
    .await
}

/// A created payment that waits on its customer: its answer's body, the payment, its intent.
async fn waiting(s: &Setup, idem: &str, capture_method: &str) -> (Vec<u8>, Value, String) {
    let created = s.pay(idem, capture_method).await;
    assert_eq!(created.status(), 201);
    let body = created.bytes().await.unwrap().to_vec();
    let payment: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payment["status"], "requires_action", "{payment}");
    let url = payment["next_action"]["redirect_to_url"]["url"].as_str().unwrap();
    assert_eq!(payment["next_action"]["type"], "redirect_to_url");
    assert!(url.contains("/_sim/authenticate/"), "where the customer goes: {url}");
    let intent = payment["processor_payment_intent_id"].as_str().unwrap().to_owned();
    assert!(intent.starts_with("pi_"), "{payment}");
    (body, payment, intent)
}

/// The create's key replays its first answer byte for byte.
async fn replays(s: &Setup, idem: &str, first: &[u8], capture_method: &str) {
    let replay = s.pay(idem, capture_method).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap().as_ref(), first, "the first answer, byte for byte");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_payment_that_needs_authentication_succeeds_once_the_customer_authenticates(
    pool: PgPool,
) {
    let s = setup(&pool, true, &[]).await;
    let (first, payment, intent) = waiting(&s, "order-1", "automatic").await;
    let id = payment["id"].as_str().unwrap();
    replays(&s, "order-1", &first, "automatic").await;
    // Nothing can be done to it while it waits: refused with a code of its own.
    let (capture, cancel) =
        (format!("/v1/payments/{id}/capture"), format!("/v1/payments/{id}/cancel"));
    let refused = s.app.post(&capture, &s.key, Some("c1"), &json!({})).await;
    assert_problem(refused, 400, "payment_requires_action").await;
    let refused = s.app.post(&cancel, &s.key, Some("x1"), &json!({})).await;
    assert_problem(refused, 400, "payment_requires_action").await;
    assert_eq!(s.payment(id).await["status"], "requires_action", "the refusals changed nothing");

    s.authenticate(&intent, "complete").await;
    let settled = s.until_status(id, "succeeded").await;
    assert_eq!(settled["amount_captured"], 700);
    assert!(settled["next_action"].is_null(), "{settled}");
    assert!(settled["processor_charge_id"].as_str().unwrap().starts_with("ch_"));
    replays(&s, "order-1", &first, "automatic").await;
    assert_eq!(events(&pool, id).await, ["payment.requires_action", "payment.succeeded"]);
    assert_eq!(deliveries(&pool, id).await, 2, "one delivery per event and endpoint");
    let audit =
        "SELECT count(*) FROM audit_events WHERE object_id = $1 AND action = 'payment.settled'";
    assert_eq!(count(&pool, audit, id).await, 1);
    let stats = s.stats().await;
    assert_eq!(
        (stats["payment_intents_created"].as_i64(), stats["charges_created"].as_i64()),
        (Some(1), Some(1))
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn with_the_webhooks_lost_the_authentication_job_asks_the_processor(pool: PgPool) {
    let s =
        setup(&pool, false, &[("PAYMENTS__PROCESSOR__AUTHENTICATION_CHECK_AFTER_S", "1")]).await;
    let (first, payment, intent) = waiting(&s, "order-1", "manual").await;
    let id = payment["id"].as_str().unwrap();
    // Before its time, and before the customer acts, the job changes nothing.
    s.worker_pass().await;
    assert_eq!(s.payment(id).await["status"], "requires_action");
    s.authenticate(&intent, "complete").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.worker_pass().await;
    assert_eq!(s.payment(id).await["status"], "requires_capture");
    // Once settled, the job is done: another pass asks nothing and writes nothing.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.worker_pass().await;
    assert_eq!(events(&pool, id).await, ["payment.requires_action", "payment.requires_capture"]);
    let done = "SELECT count(*) FROM jobs WHERE kind = 'authentication' AND dedupe_key = $1 \
                 AND done_at IS NOT NULL";
    assert_eq!(count(&pool, done, id).await, 1);
    replays(&s, "order-1", &first, "manual").await;
    // Now it can be captured.
    let capture = format!("/v1/payments/{id}/capture");
    let captured = s.app.post(&capture, &s.key, Some("c1"), &json!({})).await;
    assert_eq!(json(captured).await["status"], "succeeded");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failed_authentication_fails_the_payment(pool: PgPool) {
    let s = setup(&pool, true, &[]).await;
    let (first, payment, intent) = waiting(&s, "order-1", "automatic").await;
    let id = payment["id"].as_str().unwrap();
    s.authenticate(&intent, "fail").await;
    let failed = s.until_status(id, "failed").await;
    assert_eq!(failed["failure_code"], "payment_intent_authentication_failure", "{failed}");
    assert_eq!(events(&pool, id).await, ["payment.requires_action", "payment.failed"]);
    replays(&s, "order-1", &first, "automatic").await;
    assert_eq!(s.stats().await["charges_created"], 0, "no money moved");
    // The failed attempt left the PaymentIntent open (the customer's page could confirm it
    // again): the webhook brought the job forward, and it closes it.
    assert_eq!(s.stats().await["payment_intents_canceled"], 0);
    s.worker_pass().await;
    assert_eq!(s.stats().await["payment_intents_canceled"], 1, "closed at the processor");
    assert_eq!(s.payment(id).await["status"], "failed", "and the payment stays failed");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_authentication_never_completed_is_canceled_when_it_expires(pool: PgPool) {
    let expiry = [
        ("PAYMENTS__PROCESSOR__AUTHENTICATION_CHECK_AFTER_S", "1"),
        ("PAYMENTS__PROCESSOR__AUTHENTICATION_EXPIRES_AFTER_S", "2"),
    ];
    let s = setup(&pool, true, &expiry).await;
    let (first, payment, intent) = waiting(&s, "order-1", "automatic").await;
    let id = payment["id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.worker_pass().await;
    assert_eq!(s.payment(id).await["status"], "requires_action", "asked, and not expired yet");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    s.worker_pass().await;
    let canceled = s.until_status(id, "canceled").await;
    assert_eq!(canceled["cancellation_reason"], "abandoned");
    assert_eq!(s.stats().await["payment_intents_canceled"], 1, "canceled at the processor");
    // The customer comes back too late: the stand-in refuses, and nothing changes here.
    let url = format!("{}/_sim/payment_intents/{intent}/authenticate", s.sim);
    let late = s.http.post(url).json(&json!({"outcome": "complete"})).send().await.unwrap();
    assert_eq!(late.status(), 400);
    assert_eq!(events(&pool, id).await, ["payment.requires_action", "payment.canceled"]);
    replays(&s, "order-1", &first, "automatic").await;
}

/// Signs `event` as the processor would, and delivers it to the API.
async fn deliver(s: &Setup, event: &Value) -> Value {
    let body = serde_json::to_vec(event).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let header = signature::sign(SECRET, i64::try_from(now.as_secs()).unwrap(), &body);
    let sent = s
        .http
        .post(s.app.url("/webhooks/processor"))
        .header("stripe-signature", header)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    json(sent).await
}

#[sqlx::test(migrations = "../migrations")]
async fn duplicate_stale_and_out_of_order_webhooks_change_nothing(pool: PgPool) {
    let s = setup(&pool, true, &[]).await;
    let (_, payment, intent) = waiting(&s, "order-1", "automatic").await;
    let id = payment["id"].as_str().unwrap();
    s.authenticate(&intent, "complete").await;
    s.until_status(id, "succeeded").await;
    let settled = s.payment(id).await;

    // The very event that settled it, delivered again: a duplicate.
    let object: Value = sqlx::query_scalar(
        "SELECT jsonb_build_object('id', id, 'type', type, 'created', created, 'object', object) \
           FROM processor_events WHERE type = 'payment_intent.succeeded'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let again = json!({"id": object["id"], "object": "event", "type": object["type"],
                       "created": object["created"], "data": {"object": object["object"]}});
    assert_eq!(deliver(&s, &again).await["outcome"], "duplicate");
    // A stale `requires_action` and an out-of-order failure of the same PaymentIntent, each a
    // new event: recorded, and the payment, settled once, stays as it is.
    let mut stale = object["object"].clone();
    stale["status"] = json!("requires_action");
    let stale = json!({"id": "evt_stale", "object": "event", "type": "payment_intent.requires_action",
                       "created": 1, "data": {"object": stale}});
    assert_eq!(deliver(&s, &stale).await["outcome"], "recorded");
    let mut failed = object["object"].clone();
    failed["status"] = json!("requires_payment_method");
    failed["last_payment_error"] = json!({"type": "card_error", "code": "card_declined"});
    let failed = json!({"id": "evt_late", "object": "event", "type": "payment_intent.payment_failed",
                        "created": 2, "data": {"object": failed}});
    assert_eq!(deliver(&s, &failed).await["outcome"], "recorded");

    assert_eq!(s.payment(id).await, settled, "nothing changed");
    assert_eq!(events(&pool, id).await, ["payment.requires_action", "payment.succeeded"]);
    let extra = "SELECT count(*) FROM audit_events WHERE object_id = $1 AND action = 'payment.extra_charge'";
    assert_eq!(count(&pool, extra, id).await, 0);
}
