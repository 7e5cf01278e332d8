//! Webhooks from the processor, end to end: the stand-in sends Stripe-style `charge.*` and
//! `payment_intent.*` events, signed with `Stripe-Signature`, to the API's
//! `POST /webhooks/processor`. A payment whose PaymentIntent's answer was lost is finished from
//! the event (`payment_intent.succeeded`, `amount_capturable_updated` or `payment_failed` under
//! the create's downstream key) with no further processor call, whether the event lands before
//! the completer comes or while a holder of the key is mid-call, and the event makes a key
//! waiting out its back-off due at once; a pushed decline is the answer, unless it is for a
//! later generation of the key, and so is a declined PaymentIntent the search finds; a second
//! success for a payment (`charge.succeeded` or `payment_intent.succeeded`), reported too late
//! to stop the call, is audited for a person whichever comes second, and so is one reported
//! after the payment was refused without a charge; duplicate and out-of-order deliveries change
//! nothing; a bad signature, a replayed timestamp or a body that is no event is a 400 and records
//! nothing, and a signed event of a type not taken is answered 200 and ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payments_tests::{TestApp, assert_problem, json, start_sim, test_settings};
use payments_worker::jobs::LogMailer;
use payments_worker::{PassReport, Worker};
use processor_sim::FaultConfig;
use provider::{
    CardProcessor, FrozenRequest, PaymentIntent, ProcessorClient, ProcessorError, Refund,
};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The endpoint secret the stand-in signs with and the API verifies with.
const SECRET: &str = "whsec_inbound_test";

struct Setup {
    app: TestApp,
    sim: String,
    key: String,
    http: reqwest::Client,
}

/// The API and a stand-in that sends its webhooks to it; `overrides` are the API's settings.
async fn setup(pool: &PgPool, faults: FaultConfig, overrides: &[(&str, &str)]) -> Setup {
    let sim = start_sim(faults).await;
    let mut all = vec![
        ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
        ("PAYMENTS__PROCESSOR__WEBHOOK_SECRET", SECRET),
    ];
    all.extend_from_slice(overrides);
    let app = TestApp::spawn_with(pool.clone(), pool.clone(), &all).await;
    let http = reqwest::Client::new();
    let target = json!({"url": app.url("/webhooks/processor"), "secret": SECRET});
    let set = http.put(format!("{sim}/_sim/webhooks")).json(&target).send().await.unwrap();
    assert_eq!(set.status(), 200, "the stand-in takes the webhook target");
    let (_, key) = app.create_account("shop").await;
    Setup { app, sim, key, http }
}

impl Setup {
    async fn stats(&self) -> Value {
        json(self.http.get(format!("{}/_sim/stats", self.sim)).send().await.unwrap()).await
    }

    async fn set_faults(&self, faults: &FaultConfig) {
        let url = format!("{}/_sim/faults", self.sim);
        let set = self.http.put(url).json(faults).send().await.unwrap();
        assert_eq!(set.status(), 200);
    }

    async fn pay(&self, key: &str, capture_method: &str) -> reqwest::Response {
        let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa",
                          "capture_method": capture_method});
        self.app.post("/v1/payments", &self.key, Some(key), &body).await
    }

    /// A worker over the test database, driving keys with `processor`.
    fn worker<P: CardProcessor>(&self, processor: P) -> Worker<P> {
        let settings = test_settings(&[("PAYMENTS__PROCESSOR__BASE_URL", self.sim.as_str())]);
        // The API's own base, so that a problem the completer stores reads as the API's.
        let (pool, base) = (self.app.pool.clone(), self.app.address.as_str().into());
        Worker::new(pool, Arc::new(processor), base, &settings, Arc::new(LogMailer)).unwrap()
    }

    fn client(&self) -> ProcessorClient {
        let settings = test_settings(&[("PAYMENTS__PROCESSOR__BASE_URL", self.sim.as_str())]);
        ProcessorClient::new(settings.processor.client_config()).unwrap()
    }
}

async fn complete<P: CardProcessor>(worker: &Worker<P>) -> PassReport {
    let (_stop_tx, stop) = watch::channel(false);
    let mut report = PassReport::default();
    worker.complete(&stop, &mut report).await.expect("a completer pass");
    report
}

async fn received(pool: &PgPool) -> i64 {
    payments_domain::processor_events::count(pool).await.unwrap()
}

/// Waits (at most ten seconds: the stand-in sends at once) until `count` events were received.
async fn until_received(pool: &PgPool, count: i64) {
    for _ in 0..200 {
        if received(pool).await >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{count} processor events were not received in time (got {})", received(pool).await);
}

async fn payment_row(pool: &PgPool) -> (String, String, Option<String>) {
    sqlx::query_as("SELECT id, status, processor_charge_id FROM payments")
        .fetch_one(pool)
        .await
        .expect("one payment")
}

/// The payment's PaymentIntent (`pi_…`), as it records it.
async fn payment_intent(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar("SELECT processor_payment_intent_id FROM payments")
        .fetch_one(pool)
        .await
        .expect("one payment")
}

/// The id of the object the one received event of type `kind` reports.
async fn reported(pool: &PgPool, kind: &str) -> String {
    sqlx::query_scalar("SELECT object_id FROM processor_events WHERE type = $1")
        .bind(kind)
        .fetch_one(pool)
        .await
        .expect(kind)
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

fn unix_now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_payment_whose_intent_answer_was_lost_is_finished_from_the_webhook_without_another_processor_call(
    pool: PgPool,
) {
    // Every answer is lost after the PaymentIntent is made; its events arrive a second later,
    // after the request has given up.
    let faults =
        FaultConfig { lost_response_rate: 1.0, webhook_delay_ms: 1000, ..FaultConfig::default() };
    let s = setup(&pool, faults, &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let lost = s.pay("order-1", "automatic").await;
    assert_problem(lost, 503, "processor_unavailable").await;
    let (payment_id, status, _) = payment_row(&pool).await;
    assert_eq!(status, "processing");
    let calls = s.stats().await;
    assert_eq!(
        (&calls["payment_intents_created"], &calls["charges_created"]),
        (&json!(1), &json!(1))
    );

    // charge.succeeded and payment_intent.succeeded, under the create's downstream key.
    until_received(&pool, 2).await;
    // Any call now would lose its answer too: only the event can finish the payment.
    let report = complete(&s.worker(s.client())).await;
    assert_eq!(report.completed, 1, "{report:?}");
    let (_, status, charge) = payment_row(&pool).await;
    assert_eq!(status, "succeeded");
    let after = s.stats().await;
    assert_eq!(after["requests"], calls["requests"], "no processor call after the event");
    assert_eq!((&after["payment_intent_searches"], &after["searches"]), (&json!(0), &json!(0)));
    let pushed = reported(&pool, "payment_intent.succeeded").await;
    assert!(pushed.starts_with("pi_"), "{pushed}");
    assert_eq!(payment_intent(&pool).await, Some(pushed), "the payment adopted the event's intent");
    let pushed_charge = reported(&pool, "charge.succeeded").await;
    assert_eq!(charge, Some(pushed_charge), "and the intent's charge");
    let adopted = count(
        &pool,
        "SELECT count(*) FROM audit_events WHERE action = 'payment.reconciled' \
         AND detail->>'cause' = 'webhook'",
    )
    .await;
    assert_eq!(adopted, 1);

    // The retry gets the stored answer, and still no call is made.
    let replay = s.pay("order-1", "automatic").await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let body = json(replay).await;
    assert_eq!(body["id"], payment_id.as_str());
    assert_eq!(body["status"], "succeeded");
    assert_eq!(s.stats().await["requests"], calls["requests"]);
    let succeeded = "SELECT count(*) FROM events WHERE type = 'payment.succeeded'";
    assert_eq!(count(&pool, succeeded).await, 1, "one event for the one change");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_event_brings_a_key_waiting_out_its_back_off_forward_for_the_completer(pool: PgPool) {
    // The stand-in sends nothing here: the event is delivered by hand, when the test says.
    let faults = FaultConfig { lost_response_rate: 1.0, ..FaultConfig::default() };
    let s = setup(&pool, faults, &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let none = s.http.put(format!("{}/_sim/webhooks", s.sim)).json(&Value::Null).send().await;
    assert_eq!(none.unwrap().status(), 200);
    assert_problem(s.pay("order-1", "automatic").await, 503, "processor_unavailable").await;
    let (payment_id, _, _) = payment_row(&pool).await;
    // The key waits an hour, as after many failed attempts.
    let later = "UPDATE idempotency_keys SET next_attempt_at = now() + interval '1 hour'";
    sqlx::query(later).execute(&pool).await.unwrap();
    let worker = s.worker(s.client());
    assert_eq!(complete(&worker).await.completed, 0, "not due");

    // Read the PaymentIntent the lost answer was about (a call would now be answered: the count
    // below proves none is made).
    s.set_faults(&FaultConfig::default()).await;
    let intents =
        s.http.get(format!("{}/v1/payment_intents", s.sim)).bearer_auth("sk_test_processor");
    let intents = json(intents.send().await.unwrap()).await;
    let intent = intents["data"][0].clone();
    assert_eq!(intent["metadata"]["payment_id"], payment_id.as_str());
    assert_eq!(intent["status"], "succeeded");
    let event = json!({"id": "evt_by_hand", "object": "event", "type": "payment_intent.succeeded",
        "created": unix_now(), "data": {"object": intent},
        "request": {"id": null, "idempotency_key": format!("{payment_id}/charge")}});
    let answer = deliver(&s, &serde_json::to_vec(&event).unwrap(), unix_now()).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["outcome"], "recorded");
    let due = "SELECT count(*) FROM idempotency_keys WHERE next_attempt_at <= now()";
    assert_eq!(count(&pool, due).await, 1, "the event made the key due");

    let requests = s.stats().await["requests"].clone();
    assert_eq!(complete(&worker).await.completed, 1);
    let (_, status, charge) = payment_row(&pool).await;
    assert_eq!(
        (status.as_str(), charge.as_deref()),
        ("succeeded", intent["latest_charge"].as_str())
    );
    assert_eq!(payment_intent(&pool).await.as_deref(), intent["id"].as_str());
    assert_eq!(s.stats().await["requests"], requests, "finished without a processor call");
}

/// A key whose call was dropped before the processor acted, due now; its payment's id.
async fn waiting_key(s: &Setup, pool: &PgPool) -> String {
    s.set_faults(&FaultConfig { drop_rate: 1.0, ..FaultConfig::default() }).await;
    assert_problem(s.pay("order-1", "automatic").await, 503, "processor_unavailable").await;
    sqlx::query("UPDATE idempotency_keys SET next_attempt_at = now()").execute(pool).await.unwrap();
    payment_row(pool).await.0
}

/// The PaymentIntent `pi_declined` of `payment_id`, declined (`generic_decline`) with its failed
/// charge `ch_declined`, as Stripe shows one: back to `requires_payment_method`, with the error.
fn declined_intent(payment_id: &str) -> Value {
    json!({"id": "pi_declined", "object": "payment_intent", "amount": 500, "currency": "usd",
        "status": "requires_payment_method", "amount_capturable": 0, "amount_received": 0,
        "capture_method": "automatic", "latest_charge": "ch_declined",
        "last_payment_error": {"type": "card_error", "code": "card_declined",
            "decline_code": "generic_decline", "message": "Your card was declined.",
            "charge": "ch_declined"},
        "metadata": {"payment_id": payment_id}})
}

/// `payment_intent.payment_failed` for `payment_id` ([`declined_intent`]), as if the call under
/// `downstream_key` was declined.
fn declined(payment_id: &str, downstream_key: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": "evt_declined", "object": "event",
        "type": "payment_intent.payment_failed", "created": unix_now(),
        "request": {"id": null, "idempotency_key": downstream_key},
        "data": {"object": declined_intent(payment_id)}}))
    .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_pushed_decline_is_adopted_as_the_answer_without_a_call(pool: PgPool) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = waiting_key(&s, &pool).await;
    let event = declined(&payment_id, &format!("{payment_id}/charge"));
    let answer = deliver(&s, &event, unix_now()).await;
    assert_eq!(json(answer).await["outcome"], "recorded");
    let requests = s.stats().await["requests"].clone();
    assert_eq!(complete(&s.worker(s.client())).await.completed, 1);
    let (_, status, charge) = payment_row(&pool).await;
    assert_eq!((status.as_str(), charge.as_deref()), ("failed", Some("ch_declined")));
    assert_eq!(payment_intent(&pool).await.as_deref(), Some("pi_declined"));
    assert_eq!(s.stats().await["requests"], requests, "the decline came without a call");
    let replay = s.pay("order-1", "automatic").await;
    let problem = assert_problem(replay, 402, "card_declined").await;
    assert_eq!(problem["decline_code"], "generic_decline", "{problem}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_pushed_decline_for_a_later_generation_of_the_key_is_referred_to_a_person(pool: PgPool) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = waiting_key(&s, &pool).await;
    // As if a lookup that found nothing had moved the call to the key's second generation.
    let second = "UPDATE idempotency_keys \
                  SET planned_call = jsonb_set(planned_call, '{key}', to_jsonb((planned_call->>'key') || '/2'))";
    sqlx::query(second).execute(&pool).await.unwrap();
    let event = declined(&payment_id, &format!("{payment_id}/charge/2"));
    let answer = deliver(&s, &event, unix_now()).await;
    assert_eq!(json(answer).await["outcome"], "recorded");
    let report = complete(&s.worker(s.client())).await;
    assert_eq!((report.completed, report.flagged), (0, 1), "{report:?}");
    assert_eq!(payment_row(&pool).await.1, "processing", "no decline was stored");
    let flagged = "SELECT count(*) FROM idempotency_keys WHERE needs_human_at IS NOT NULL";
    assert_eq!(count(&pool, flagged).await, 1);
}

/// A webhook that reports a PaymentIntent that succeeded under the key's first generation after
/// the key moved on to the second: the call under the second would charge again, so a person
/// decides.
#[sqlx::test(migrations = "../migrations")]
async fn a_pushed_charge_of_an_earlier_generation_stops_the_call_under_a_later_one(pool: PgPool) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = waiting_key(&s, &pool).await;
    // As if a lookup that found nothing had moved the call to the key's second generation.
    let second = "UPDATE idempotency_keys \
                  SET planned_call = jsonb_set(planned_call, '{key}', to_jsonb((planned_call->>'key') || '/2'))";
    sqlx::query(second).execute(&pool).await.unwrap();
    let event =
        intent_succeeded("evt_charged", &payment_id, "pi_first", &format!("{payment_id}/charge"));
    let answer = deliver(&s, &event, unix_now()).await;
    assert_eq!(json(answer).await["outcome"], "recorded");
    s.set_faults(&FaultConfig::default()).await;
    let requests = s.stats().await["requests"].clone();
    let report = complete(&s.worker(s.client())).await;
    assert_eq!((report.completed, report.flagged), (0, 1), "{report:?}");
    assert_eq!(s.stats().await["requests"], requests, "no call under the second generation");
    assert_eq!(payment_row(&pool).await.1, "processing");
}

/// The real client, whose PaymentIntent create waits, mid-call, until the processor's webhooks
/// about what it made (`charge.succeeded` and the intent's own) have been received, and then
/// reports its answer lost.
struct AnswerLostAfterTheWebhook {
    client: ProcessorClient,
    pool: PgPool,
}

impl CardProcessor for AnswerLostAfterTheWebhook {
    async fn create_refund(&self, request: &FrozenRequest) -> Result<Refund, ProcessorError> {
        self.client.create_refund(request).await
    }
    async fn create_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        let made = self.client.create_payment_intent(request).await?;
        until_received(&self.pool, 2).await;
        Err(ProcessorError::UnknownOutcome {
            message: format!("the answer ({}) was lost", made.id),
        })
    }
    async fn capture_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.client.capture_payment_intent(request).await
    }
    async fn cancel_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.client.cancel_payment_intent(request).await
    }
    async fn retrieve_payment_intent(&self, id: &str) -> Result<PaymentIntent, ProcessorError> {
        self.client.retrieve_payment_intent(id).await
    }
    async fn search_payment_intents(
        &self,
        payment_id: &str,
    ) -> Result<Vec<PaymentIntent>, ProcessorError> {
        self.client.search_payment_intents(payment_id).await
    }
    async fn list_intent_refunds(&self, id: &str) -> Result<Vec<Refund>, ProcessorError> {
        self.client.list_intent_refunds(id).await
    }
    fn longest_call(&self) -> Duration {
        self.client.longest_call()
    }
    fn search_lag(&self) -> Duration {
        self.client.search_lag()
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_webhook_that_lands_while_the_key_holder_is_mid_call_finishes_the_payment_in_that_holder(
    pool: PgPool,
) {
    // The first attempt is dropped before the processor acts: the key waits at its call.
    let dropped = FaultConfig { drop_rate: 1.0, ..FaultConfig::default() };
    let s = setup(&pool, dropped, &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    assert_problem(s.pay("order-1", "manual").await, 503, "processor_unavailable").await;
    assert_eq!(s.stats().await["payment_intents_created"], 0);
    s.set_faults(&FaultConfig::default()).await;
    // Its back-off run out, by the database's clock.
    sqlx::query("UPDATE idempotency_keys SET next_attempt_at = now()")
        .execute(&pool)
        .await
        .unwrap();

    // The completer holds the key; its call makes the PaymentIntent (authorized, for a manual
    // capture), the events land while it waits for the answer, and the answer is lost.
    let mid_call = AnswerLostAfterTheWebhook { client: s.client(), pool: pool.clone() };
    let report = complete(&s.worker(mid_call)).await;
    assert_eq!(report.completed, 1, "the holder finished from the event: {report:?}");
    let (_, status, charge) = payment_row(&pool).await;
    assert_eq!(status, "requires_capture");
    let stats = s.stats().await;
    assert_eq!(
        (&stats["payment_intents_created"], &stats["charges_created"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(stats["payment_intent_searches"], 0, "the event made a search needless");
    assert_eq!(stats["searches"], 0);
    let pushed = reported(&pool, "payment_intent.amount_capturable_updated").await;
    assert_eq!(payment_intent(&pool).await, Some(pushed), "the payment adopted the event's intent");
    assert_eq!(charge, Some(reported(&pool, "charge.succeeded").await));
    let finished = "SELECT count(*) FROM idempotency_keys WHERE completed_at IS NOT NULL";
    assert_eq!(count(&pool, finished).await, 1);
    let authorized = "SELECT count(*) FROM events WHERE type = 'payment.requires_capture'";
    assert_eq!(count(&pool, authorized).await, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn duplicate_and_out_of_order_deliveries_change_nothing(pool: PgPool) {
    let faults = FaultConfig {
        seed: 7,
        webhook_duplicate_rate: 1.0,
        webhook_reorder_rate: 0.5,
        ..FaultConfig::default()
    };
    let s = setup(&pool, faults, &[]).await;
    let auto = json(s.pay("order-1", "automatic").await).await;
    let manual = json(s.pay("order-2", "manual").await).await;
    let path = format!("/v1/payments/{}/capture", manual["id"].as_str().unwrap());
    let captured = s.app.post(&path, &s.key, Some("capture-2"), &json!({})).await;
    assert_eq!(captured.status(), 200);
    let path = format!("/v1/payments/{}/refunds", auto["id"].as_str().unwrap());
    let refunded = s.app.post(&path, &s.key, Some("refund-1"), &json!({"amount": 200})).await;
    assert_eq!(refunded.status(), 201);
    let snapshot = "SELECT string_agg(id || status || amount_captured || amount_refunded || \
                    coalesce(processor_payment_intent_id, '') || coalesce(processor_charge_id, ''), \
                    ',' ORDER BY id) FROM payments";
    let before: String = sqlx::query_scalar(snapshot).fetch_one(&pool).await.unwrap();
    let events_before = count(&pool, "SELECT count(*) FROM events").await;

    // Each PaymentIntent's charge succeeded (×2), one intent succeeded and the other was
    // authorized, then captured (the charge's event and the intent's), and a refund: seven
    // events, each delivered twice.
    until_received(&pool, 7).await;
    for _ in 0..200 {
        if s.stats().await["webhooks_delivered"].as_u64() >= Some(14) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = s.stats().await;
    assert_eq!(stats["events_created"], 7);
    assert_eq!(stats["webhooks_delivered"], 14, "every event was delivered twice: {stats}");
    assert_eq!(received(&pool).await, 7, "one record per event id");
    let kinds = "SELECT string_agg(type, ',' ORDER BY type) FROM processor_events";
    let kinds: String = sqlx::query_scalar(kinds).fetch_one(&pool).await.unwrap();
    assert_eq!(
        kinds,
        "charge.captured,charge.refunded,charge.succeeded,charge.succeeded,\
         payment_intent.amount_capturable_updated,payment_intent.succeeded,\
         payment_intent.succeeded"
    );
    let matched = "SELECT count(*) FROM processor_events WHERE payment_id IS NOT NULL";
    assert_eq!(count(&pool, matched).await, 7);

    assert_eq!(complete(&s.worker(s.client())).await.completed, 0, "nothing was left to do");
    let after: String = sqlx::query_scalar(snapshot).fetch_one(&pool).await.unwrap();
    assert_eq!(after, before, "the payments did not change");
    assert_eq!(count(&pool, "SELECT count(*) FROM events").await, events_before);

    // By hand: the manual payment's PaymentIntent reported captured before it is reported
    // authorized, each twice.
    let intent = manual["processor_payment_intent_id"].as_str().unwrap();
    assert!(intent.starts_with("pi_"), "{manual}");
    let (at, charge) = (unix_now(), &manual["processor_charge_id"]);
    let object = |status: &str, capturable: i64, received: i64| {
        json!({"id": intent, "object": "payment_intent", "amount": 500, "currency": "usd",
            "status": status, "amount_capturable": capturable, "amount_received": received,
            "capture_method": "manual", "latest_charge": charge,
            "metadata": {"payment_id": manual["id"]}})
    };
    let (captured, authorized) = (object("succeeded", 0, 500), object("requires_capture", 500, 0));
    for (id, kind, object, created, outcome) in [
        ("evt_hand_2", "payment_intent.succeeded", &captured, at + 1, "recorded"),
        ("evt_hand_2", "payment_intent.succeeded", &captured, at + 1, "duplicate"),
        ("evt_hand_1", "payment_intent.amount_capturable_updated", &authorized, at, "recorded"),
        ("evt_hand_1", "payment_intent.amount_capturable_updated", &authorized, at, "duplicate"),
    ] {
        let event = json!({"id": id, "object": "event", "type": kind, "created": created,
                           "data": {"object": object}, "request": {"idempotency_key": null}});
        let answer = deliver(&s, &serde_json::to_vec(&event).unwrap(), unix_now()).await;
        assert_eq!(answer.status(), 200);
        assert_eq!(json(answer).await["outcome"], outcome, "{id} {kind}");
    }
    assert_eq!(received(&pool).await, 9);
    assert_eq!(extra_charges(&pool).await, [], "the payment's own intent is no extra charge");
    let after: String = sqlx::query_scalar(snapshot).fetch_one(&pool).await.unwrap();
    assert_eq!(after, before, "the payments did not change");
}

async fn deliver(s: &Setup, body: &[u8], signed_at: i64) -> reqwest::Response {
    let signature = provider::signature::sign(SECRET, signed_at, body);
    let request = s.app.http.post(s.app.url("/webhooks/processor"));
    s.app.send(request.header("stripe-signature", signature).body(body.to_vec())).await
}

#[sqlx::test(migrations = "../migrations")]
async fn a_bad_signature_an_old_timestamp_or_malformed_json_is_a_400_and_an_unknown_type_is_ignored(
    pool: PgPool,
) {
    let s = setup(&pool, FaultConfig::default(), &[]).await;
    // Nothing is sent by the stand-in in this test: the deliveries are made by hand.
    let none = s.http.put(format!("{}/_sim/webhooks", s.sim)).json(&Value::Null).send().await;
    assert_eq!(none.unwrap().status(), 200);
    let paid = json(s.pay("order-1", "automatic").await).await;
    let key_state = "SELECT recovery_point || next_attempt_at::text FROM idempotency_keys";
    let key_before: String = sqlx::query_scalar(key_state).fetch_one(&pool).await.unwrap();
    let event = |kind: &str| {
        serde_json::to_vec(&json!({"id": "evt_1", "object": "event", "type": kind,
            "created": unix_now(), "request": {"idempotency_key": "x"},
            "data": {"object": {"id": "ch_1", "object": "charge", "amount": 500,
                "currency": "usd", "captured": true, "paid": true, "status": "succeeded",
                "amount_captured": 500, "amount_refunded": 0, "refunded": false,
                "metadata": {"payment_id": paid["id"]}}}}))
        .unwrap()
    };
    let good = event("charge.succeeded");
    let url = s.app.url("/webhooks/processor");

    let unsigned = s.app.send(s.app.http.post(&url).body(good.clone())).await;
    let problem = assert_problem(unsigned, 400, "invalid_request").await;
    assert_eq!(problem["param"], "Stripe-Signature");

    let forged = provider::signature::sign("whsec_someone_else", unix_now(), &good);
    let forged =
        s.app.send(s.app.http.post(&url).header("stripe-signature", forged).body(good.clone()));
    let problem = assert_problem(forged.await, 400, "invalid_request").await;
    assert!(problem["detail"].as_str().unwrap().contains("no signature"), "{problem}");

    let replayed = deliver(&s, &good, unix_now() - 301).await;
    let problem = assert_problem(replayed, 400, "invalid_request").await;
    assert!(problem["detail"].as_str().unwrap().contains("tolerance"), "{problem}");

    // Signed, of a type not taken: answered 200 (a refusal would be retried for days) and
    // ignored.
    let unknown = deliver(&s, &event("customer.created"), unix_now()).await;
    assert_eq!(unknown.status(), 200);
    assert_eq!(json(unknown).await["outcome"], "ignored");

    let malformed = deliver(&s, b"{\"id\": \"evt_1\", ", unix_now()).await;
    assert_problem(malformed, 400, "invalid_request").await;

    let too_large = vec![b' '; 70_000];
    let too_large = deliver(&s, &too_large, unix_now()).await;
    assert_problem(too_large, 413, "payload_too_large").await;

    assert_eq!(received(&pool).await, 0, "nothing was recorded");
    let key_after: String = sqlx::query_scalar(key_state).fetch_one(&pool).await.unwrap();
    assert_eq!(key_after, key_before, "no key was touched");

    // The same event, signed, is taken: the refusals above were about what was wrong with each.
    let answer = deliver(&s, &good, unix_now()).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["payment"], paid["id"]);
    assert_eq!(received(&pool).await, 1);

    // A charge that is none of our payments': recorded, answered 200, nothing else.
    let unknown_charge = serde_json::to_vec(&json!({"id": "evt_2", "object": "event",
        "type": "charge.succeeded", "created": unix_now(), "data": {"object": {"id": "ch_2",
        "object": "charge", "amount": 100, "currency": "usd", "captured": true, "paid": true,
        "status": "succeeded", "amount_captured": 100, "amount_refunded": 0, "refunded": false,
        "metadata": {"payment_id": "pay_not_ours"}}}}))
    .unwrap();
    let answer = deliver(&s, &unknown_charge, unix_now()).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["outcome"], "unmatched");
    let unmatched = "SELECT count(*) FROM processor_events WHERE payment_id IS NULL";
    assert_eq!(count(&pool, unmatched).await, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn without_a_secret_the_processor_webhook_route_is_off(pool: PgPool) {
    let sim = start_sim(FaultConfig::default()).await;
    let app = TestApp::spawn_with(
        pool.clone(),
        pool.clone(),
        &[("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str())],
    )
    .await;
    let body = b"{}".to_vec();
    let signature = provider::signature::sign("", unix_now(), &body);
    let request =
        app.http.post(app.url("/webhooks/processor")).header("stripe-signature", signature);
    assert_problem(app.send(request.body(body)).await, 404, "resource_missing").await;
    assert_eq!(received(&pool).await, 0);
}

/// `charge.succeeded` for `payment_id`: the charge `charge_id`, made by the call under
/// `downstream_key`.
fn charge_succeeded(
    event_id: &str,
    payment_id: &str,
    charge_id: &str,
    downstream_key: &str,
) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": event_id, "object": "event", "type": "charge.succeeded",
        "created": unix_now(), "request": {"id": null, "idempotency_key": downstream_key},
        "data": {"object": {"id": charge_id, "object": "charge", "amount": 500,
            "currency": "usd", "captured": true, "paid": true, "status": "succeeded",
            "amount_captured": 500, "amount_refunded": 0, "refunded": false,
            "metadata": {"payment_id": payment_id}}}}))
    .unwrap()
}

/// `payment_intent.succeeded` for `payment_id`: the PaymentIntent `intent_id`, made and captured
/// by the call under `downstream_key`.
fn intent_succeeded(
    event_id: &str,
    payment_id: &str,
    intent_id: &str,
    downstream_key: &str,
) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": event_id, "object": "event",
        "type": "payment_intent.succeeded", "created": unix_now(),
        "request": {"id": null, "idempotency_key": downstream_key},
        "data": {"object": {"id": intent_id, "object": "payment_intent", "amount": 500,
            "currency": "usd", "status": "succeeded", "amount_capturable": 0,
            "amount_received": 500, "capture_method": "automatic",
            "latest_charge": intent_id.replacen("pi_", "ch_", 1),
            "metadata": {"payment_id": payment_id}}}}))
    .unwrap()
}

/// The `payment.extra_charge` audit records: (the extra charge, who found it).
async fn extra_charges(pool: &PgPool) -> Vec<(String, String)> {
    let sql = "SELECT detail->>'extra_charge', detail->>'found_by' FROM audit_events \
               WHERE action = 'payment.extra_charge' ORDER BY id";
    sqlx::query_as(sql).fetch_all(pool).await.expect(sql)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_second_successful_charge_reported_after_the_payment_recorded_its_own_is_audited_for_a_person(
    pool: PgPool,
) {
    let s = setup(&pool, FaultConfig::default(), &[]).await;
    let none = s.http.put(format!("{}/_sim/webhooks", s.sim)).json(&Value::Null).send().await;
    assert_eq!(none.unwrap().status(), 200, "the deliveries are made by hand");
    let paid = json(s.pay("order-1", "automatic").await).await;
    let (payment_id, own) = (paid["id"].as_str().unwrap(), &paid["processor_charge_id"]);
    let own = own.as_str().unwrap();

    // The payment's own charge, reported: nothing to see.
    let event = charge_succeeded("evt_own", payment_id, own, &format!("{payment_id}/charge/2"));
    assert_eq!(json(deliver(&s, &event, unix_now()).await).await["outcome"], "recorded");
    assert_eq!(extra_charges(&pool).await, []);
    // A charge an earlier generation of the key made, which the lookups missed, reported late:
    // the card was charged twice.
    let event =
        charge_succeeded("evt_extra", payment_id, "ch_extra", &format!("{payment_id}/charge"));
    let answer = json(deliver(&s, &event, unix_now()).await).await;
    assert_eq!((&answer["outcome"], &answer["payment"]), (&json!("recorded"), &json!(payment_id)));
    assert_eq!(extra_charges(&pool).await, [("ch_extra".to_owned(), "webhook".to_owned())]);
    let (_, status, charge) = payment_row(&pool).await;
    assert_eq!(
        (status.as_str(), charge.as_deref()),
        ("succeeded", Some(own)),
        "nothing else moved"
    );
}

/// The real client, except that the processor's webhook about another PaymentIntent that
/// succeeded for the payment (`pi_extra`, under the key's first generation) is delivered, and
/// received, while the key's holder is mid-call (`Then`).
struct AnotherChargeReportedMidCall {
    client: ProcessorClient,
    http: reqwest::Client,
    webhook_url: String,
    pool: PgPool,
    then: Then,
}

/// When the other PaymentIntent is reported, and what the holder's call meets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// During the create, after the PaymentIntent is made and authorized.
    Charged,
    /// During the search that follows a create the processor would not answer for
    /// (`MustReconcile`), which then finds only a declined PaymentIntent.
    DeclineFound,
    /// During the create, which the processor then refuses outright: a 400, nothing made.
    Refused,
    /// During the create, which the processor then declines (`pi_declined`, whose failed charge
    /// is `ch_declined`).
    Declined,
}

impl AnotherChargeReportedMidCall {
    fn new(s: &Setup, pool: &PgPool, then: Then) -> Self {
        Self {
            client: s.client(),
            http: s.http.clone(),
            webhook_url: s.app.url("/webhooks/processor"),
            pool: pool.clone(),
            then,
        }
    }

    async fn report_the_other_charge(&self, payment_id: &str) {
        let first = format!("{payment_id}/charge");
        let event = intent_succeeded("evt_extra", payment_id, "pi_extra", &first);
        let signature = provider::signature::sign(SECRET, unix_now(), &event);
        let sent = self.http.post(&self.webhook_url).header("stripe-signature", signature);
        assert_eq!(sent.body(event).send().await.unwrap().status(), 200);
        until_received(&self.pool, 1).await;
    }
}

impl CardProcessor for AnotherChargeReportedMidCall {
    async fn create_refund(&self, request: &FrozenRequest) -> Result<Refund, ProcessorError> {
        self.client.create_refund(request).await
    }
    async fn create_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        match self.then {
            Then::DeclineFound => Err(ProcessorError::MustReconcile {
                cause: provider::ReconcileCause::KeyReused,
                message: "the processor will not say what the key did".into(),
            }),
            Then::Refused | Then::Declined => {
                let payment_id = request.field("metadata[payment_id]");
                self.report_the_other_charge(payment_id.expect("the intent names its payment"))
                    .await;
                Err(match self.then {
                    Then::Declined => ProcessorError::Declined {
                        decline_code: "generic_decline".into(),
                        message: "Your card was declined.".into(),
                        charge_id: Some("ch_declined".into()),
                        payment_intent: Some("pi_declined".into()),
                    },
                    _ => ProcessorError::Invalid {
                        status: 400,
                        code: Some("amount_too_small".into()),
                        param: Some("amount".into()),
                        message: "Amount must be at least 50 cents.".into(),
                    },
                })
            }
            Then::Charged => {
                let made = self.client.create_payment_intent(request).await?;
                self.report_the_other_charge(&made.metadata["payment_id"]).await;
                Ok(made)
            }
        }
    }
    async fn capture_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.client.capture_payment_intent(request).await
    }
    async fn cancel_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.client.cancel_payment_intent(request).await
    }
    async fn retrieve_payment_intent(&self, id: &str) -> Result<PaymentIntent, ProcessorError> {
        self.client.retrieve_payment_intent(id).await
    }
    async fn search_payment_intents(
        &self,
        payment_id: &str,
    ) -> Result<Vec<PaymentIntent>, ProcessorError> {
        if self.then != Then::DeclineFound {
            return self.client.search_payment_intents(payment_id).await;
        }
        self.report_the_other_charge(payment_id).await;
        Ok(vec![serde_json::from_value(declined_intent(payment_id)).unwrap()])
    }
    async fn list_intent_refunds(&self, id: &str) -> Result<Vec<Refund>, ProcessorError> {
        self.client.list_intent_refunds(id).await
    }
    fn longest_call(&self) -> Duration {
        self.client.longest_call()
    }
    fn search_lag(&self) -> Duration {
        self.client.search_lag()
    }
}

/// A key at its charge, due now (`waiting_key`), with the stand-in's own webhooks off (the
/// deliveries are made by hand) and its faults cleared; its payment's id.
async fn waiting_key_webhooks_by_hand(s: &Setup, pool: &PgPool) -> String {
    let payment_id = waiting_key(s, pool).await;
    let none = s.http.put(format!("{}/_sim/webhooks", s.sim)).json(&Value::Null).send().await;
    assert_eq!(none.unwrap().status(), 200, "the deliveries are made by hand");
    s.set_faults(&FaultConfig::default()).await;
    payment_id
}

/// As `waiting_key_webhooks_by_hand`, moved to the key's second generation (as if a lookup that
/// found nothing had moved it).
async fn second_generation_key(s: &Setup, pool: &PgPool) -> String {
    let payment_id = waiting_key_webhooks_by_hand(s, pool).await;
    let second = "UPDATE idempotency_keys \
                  SET planned_call = jsonb_set(planned_call, '{key}', to_jsonb((planned_call->>'key') || '/2'))";
    sqlx::query(second).execute(pool).await.unwrap();
    payment_id
}

#[sqlx::test(migrations = "../migrations")]
async fn a_second_successful_charge_reported_while_a_later_generation_was_called_is_audited_for_a_person(
    pool: PgPool,
) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    // The earlier generation's PaymentIntent is reported only while the second is being made.
    let payment_id = second_generation_key(&s, &pool).await;
    let processor = AnotherChargeReportedMidCall::new(&s, &pool, Then::Charged);
    let report = complete(&s.worker(processor)).await;
    assert_eq!(report.completed, 1, "{report:?}");
    let (id, status, charge) = payment_row(&pool).await;
    assert_eq!((id.as_str(), status.as_str()), (payment_id.as_str(), "succeeded"));
    let intents =
        s.http.get(format!("{}/v1/payment_intents", s.sim)).bearer_auth("sk_test_processor");
    let made = json(intents.send().await.unwrap()).await["data"][0].clone();
    assert_eq!(
        (payment_intent(&pool).await.as_deref(), charge.as_deref()),
        (made["id"].as_str(), made["latest_charge"].as_str()),
        "the payment records the PaymentIntent its call made"
    );
    // The event landed while the holder was mid-call, before the phase that records the intent:
    // the phase saw it.
    assert_eq!(extra_charges(&pool).await, [("pi_extra".to_owned(), "phase".to_owned())]);
}

/// A decline the search finds under a later generation, while the earlier generation's charge
/// is reported: the decline proves nothing about that charge, so nothing is stored and a person
/// looks (the event is there for them).
#[sqlx::test(migrations = "../migrations")]
async fn a_successful_charge_reported_while_a_later_generation_was_found_declined_is_left_to_a_person(
    pool: PgPool,
) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = second_generation_key(&s, &pool).await;
    let processor = AnotherChargeReportedMidCall::new(&s, &pool, Then::DeclineFound);
    let report = complete(&s.worker(processor)).await;
    assert_eq!((report.completed, report.flagged), (0, 1), "{report:?}");
    let (id, status, charge) = payment_row(&pool).await;
    assert_eq!((id.as_str(), status.as_str(), charge), (payment_id.as_str(), "processing", None));
    assert_eq!(payment_intent(&pool).await, None);
    assert_eq!(received(&pool).await, 1, "the earlier generation's PaymentIntent is on record");
}

/// A processor whose every PaymentIntent create answers a replayed 500 (`MustReconcile`), and
/// whose search shows nothing for the payment until its key's second generation was called, and
/// then only a declined PaymentIntent: as if the first generation's call made a successful one
/// that the search trails past its documented lag.
struct SearchMissesTheFirstCharge {
    /// The downstream keys called, in order.
    called: Arc<Mutex<Vec<String>>>,
}

impl CardProcessor for SearchMissesTheFirstCharge {
    async fn create_refund(&self, _: &FrozenRequest) -> Result<Refund, ProcessorError> {
        unreachable!("no refund")
    }
    async fn create_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.called.lock().unwrap().push(request.key.as_str().to_owned());
        Err(ProcessorError::MustReconcile {
            cause: provider::ReconcileCause::ReplayedFailure(500),
            message: "the processor replays a 500 for this key".into(),
        })
    }
    async fn capture_payment_intent(
        &self,
        _: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        unreachable!("no capture")
    }
    async fn cancel_payment_intent(
        &self,
        _: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        unreachable!("no cancel")
    }
    async fn retrieve_payment_intent(&self, _: &str) -> Result<PaymentIntent, ProcessorError> {
        unreachable!("no PaymentIntent is read by its id")
    }
    async fn search_payment_intents(
        &self,
        payment_id: &str,
    ) -> Result<Vec<PaymentIntent>, ProcessorError> {
        let second = self.called.lock().unwrap().iter().any(|key| key.ends_with("/charge/2"));
        if !second {
            return Ok(vec![]);
        }
        Ok(vec![serde_json::from_value(declined_intent(payment_id)).unwrap()])
    }
    async fn list_intent_refunds(&self, _: &str) -> Result<Vec<Refund>, ProcessorError> {
        unreachable!("no refund")
    }
    fn longest_call(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn search_lag(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// The first generation's call is lost and the search misses its PaymentIntent; the second
/// generation's call answers a replayed 500, and the search then shows only a declined one. That decline
/// proves nothing about the first generation's call: nothing is stored, a person looks, as when
/// the second generation's call or the processor's webhook reports a decline.
#[sqlx::test(migrations = "../migrations")]
async fn a_decline_the_search_finds_under_a_later_generation_is_referred_to_a_person(pool: PgPool) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = waiting_key_webhooks_by_hand(&s, &pool).await;
    let called = Arc::new(Mutex::new(Vec::new()));
    let worker = s.worker(SearchMissesTheFirstCharge { called: Arc::clone(&called) });
    // The search finds nothing, too soon after the call for "nothing" to be believed: a wait.
    let report = complete(&worker).await;
    assert_eq!((report.completed, report.flagged), (0, 0), "{report:?}");
    // By the database's clock the call is now old enough: the key moves to its second
    // generation, whose decline the search then finds.
    let settled = "UPDATE idempotency_keys SET unresolved_at = unresolved_at - interval '1 minute', \
                   next_attempt_at = now()";
    sqlx::query(settled).execute(&pool).await.unwrap();
    let report = complete(&worker).await;
    assert_eq!((report.completed, report.flagged), (0, 1), "{report:?}");
    let first = format!("{payment_id}/charge");
    let called = called.lock().unwrap().clone();
    assert_eq!(called, [first.clone(), first.clone(), format!("{first}/2")]);
    let (_, status, charge) = payment_row(&pool).await;
    assert_eq!((status.as_str(), charge), ("processing", None), "no decline was stored");
    assert_eq!(payment_intent(&pool).await, None);
    let unfinished = "SELECT count(*) FROM idempotency_keys \
                      WHERE needs_human_at IS NOT NULL AND response_status IS NULL";
    assert_eq!(count(&pool, unfinished).await, 1, "the key is a person's, with no stored answer");
}

/// A payment recorded `failed` with no charge (the processor refused the call outright), for
/// which the processor then reports a successful charge anyway: no phase will ever adopt it, so
/// it is an extra charge for a person, like a second one.
#[sqlx::test(migrations = "../migrations")]
async fn a_successful_charge_reported_after_the_payment_was_refused_without_a_charge_is_audited_for_a_person(
    pool: PgPool,
) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = waiting_key_webhooks_by_hand(&s, &pool).await;
    // The call, sent again under the same downstream key, is refused: a 400, nothing made.
    let processor = MockServer::start().await;
    let refused = json!({"error": {"type": "invalid_request_error", "code": "amount_too_small",
        "param": "amount", "message": "Amount must be at least 50 cents."}});
    Mock::given(method("POST"))
        .and(path("/v1/payment_intents"))
        .respond_with(ResponseTemplate::new(400).set_body_json(refused))
        .expect(1)
        .mount(&processor)
        .await;
    let settings = test_settings(&[("PAYMENTS__PROCESSOR__BASE_URL", processor.uri().as_str())]);
    let client = ProcessorClient::new(settings.processor.client_config()).unwrap();
    let report = complete(&s.worker(client)).await;
    assert_eq!(report.completed, 1, "{report:?}");
    let calls = processor.received_requests().await.unwrap();
    let calls: Vec<_> = calls.iter().map(|call| (call.method.as_str(), call.url.path())).collect();
    assert_eq!(calls, [("POST", "/v1/payment_intents")], "the create, refused, and nothing else");
    let (_, status, charge) = payment_row(&pool).await;
    assert_eq!((status.as_str(), charge), ("failed", None));
    assert_eq!(payment_intent(&pool).await, None);

    // A success reported for the payment after all: its key is finished, so nothing will adopt
    // the PaymentIntent, and the payment accounts for none.
    let first = format!("{payment_id}/charge");
    let event = intent_succeeded("evt_extra", &payment_id, "pi_extra", &first);
    let answer = json(deliver(&s, &event, unix_now()).await).await;
    assert_eq!((&answer["outcome"], &answer["payment"]), (&json!("recorded"), &json!(payment_id)));
    assert_eq!(extra_charges(&pool).await, [("pi_extra".to_owned(), "webhook".to_owned())]);
    assert_eq!(payment_row(&pool).await.1, "failed", "nothing else moved");
}

/// As above, with the success reported while the refused call is on its way: the phase that
/// records the refusal sees it, under the first generation too.
#[sqlx::test(migrations = "../migrations")]
async fn a_successful_charge_reported_while_the_call_was_being_refused_is_audited_for_a_person(
    pool: PgPool,
) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = waiting_key_webhooks_by_hand(&s, &pool).await;
    let processor = AnotherChargeReportedMidCall::new(&s, &pool, Then::Refused);
    let report = complete(&s.worker(processor)).await;
    assert_eq!(report.completed, 1, "{report:?}");
    let (id, status, charge) = payment_row(&pool).await;
    assert_eq!((id.as_str(), status.as_str(), charge), (payment_id.as_str(), "failed", None));
    assert_eq!(payment_intent(&pool).await, None);
    // The event landed while the payment was still processing, so the webhook saw nothing amiss:
    // the phase that recorded the refusal found it.
    assert_eq!(extra_charges(&pool).await, [("pi_extra".to_owned(), "phase".to_owned())]);
}

/// As above, with a decline that names its PaymentIntent and its failed charge: the phase that
/// records the decline looks, under the first generation too.
#[sqlx::test(migrations = "../migrations")]
async fn a_successful_charge_reported_while_the_call_was_being_declined_is_audited_for_a_person(
    pool: PgPool,
) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let payment_id = waiting_key_webhooks_by_hand(&s, &pool).await;
    let processor = AnotherChargeReportedMidCall::new(&s, &pool, Then::Declined);
    let report = complete(&s.worker(processor)).await;
    assert_eq!(report.completed, 1, "{report:?}");
    let (id, status, charge) = payment_row(&pool).await;
    assert_eq!(
        (id.as_str(), status.as_str(), charge.as_deref()),
        (payment_id.as_str(), "failed", Some("ch_declined"))
    );
    assert_eq!(payment_intent(&pool).await.as_deref(), Some("pi_declined"));
    assert_eq!(extra_charges(&pool).await, [("pi_extra".to_owned(), "phase".to_owned())]);
}

/// Every decline card the stand-in knows, with the decline code it is refused with.
const DECLINE_CARDS: [(&str, &str); 3] = [
    ("pm_card_chargeDeclined", "generic_decline"),
    ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds"),
    ("pm_card_chargeDeclinedExpiredCard", "expired_card"),
];

impl Setup {
    async fn pay_with(&self, key: &str, card: &str) -> reqwest::Response {
        let body = json!({"amount": 500, "currency": "usd", "payment_method": card});
        self.app.post("/v1/payments", &self.key, Some(key), &body).await
    }

    /// The 402 `response` for a decline with `code` and its failed payment: the problem less the
    /// members that name the request or the payment, and the payment's `failure_code` and
    /// `failure_message`. (A retry that resumes the key answers with the id of the request that
    /// claimed it, so the request ids are not compared.)
    async fn decline(&self, response: reqwest::Response, code: &str) -> (Value, Value, Value) {
        assert_eq!(response.status(), 402);
        let mut problem = json(response).await;
        assert_eq!(problem["code"], "card_declined", "{problem}");
        assert_eq!(problem["decline_code"], code, "{problem}");
        let payment_id = problem["payment_id"].as_str().unwrap().to_owned();
        let payment = json(self.app.get(&format!("/v1/payments/{payment_id}"), &self.key).await);
        let payment = payment.await;
        assert_eq!(payment["status"], "failed");
        assert_eq!(payment["failure_code"], code, "{payment}");
        let intent =
            payment["processor_payment_intent_id"].as_str().expect("a recorded PaymentIntent");
        assert!(intent.starts_with("pi_"), "the declined PaymentIntent is recorded: {payment}");
        let members = problem.as_object_mut().unwrap();
        for name in ["request_id", "payment_id", "instance"] {
            members.remove(name);
        }
        (problem, payment["failure_code"].clone(), payment["failure_message"].clone())
    }
}

async fn adoptions(pool: &PgPool, cause: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE action = 'payment.reconciled' \
         AND detail->>'outcome' = 'adopted' AND detail->>'cause' = $1",
    )
    .bind(cause)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The processor declines the card, then answers a 500 it keeps for the key: the request finds
/// the declined charge by search and adopts it. The decline code is the charge's
/// `outcome.reason`, not its `failure_code` (the error's code, `card_declined`): the answer and
/// the payment are those the 402 itself would have given, for every decline card.
#[sqlx::test(migrations = "../migrations")]
async fn a_decline_adopted_from_the_search_answers_as_the_decline_itself(pool: PgPool) {
    let s = setup(&pool, FaultConfig::default(), &[]).await;
    let none = s.http.put(format!("{}/_sim/webhooks", s.sim)).json(&Value::Null).send().await;
    assert_eq!(none.unwrap().status(), 200, "no webhooks: only the search can tell");
    let kept_500 = FaultConfig { error_after_processing_rate: 1.0, ..FaultConfig::default() };
    for (n, (card, code)) in DECLINE_CARDS.into_iter().enumerate() {
        s.set_faults(&FaultConfig::default()).await;
        let direct = s.decline(s.pay_with(&format!("direct-{n}"), card).await, code).await;
        s.set_faults(&kept_500).await;
        let adopted = s.decline(s.pay_with(&format!("kept-{n}"), card).await, code).await;
        assert_eq!(adopted, direct, "{card}");
    }
    assert_eq!(adoptions(&pool, "replayed_failure").await, 3, "each was found by the search");
    let stats = s.stats().await;
    assert_eq!(stats["payment_intents_created"], 6, "one PaymentIntent per payment");
    assert_eq!(stats["charges_created"], 6, "one charge per payment");
}

/// The processor declines the card and the answer is lost; its webhook reports the declined
/// PaymentIntent, and the retry adopts it without a call. The answer and the payment are those the 402
/// itself would have given, for every decline card.
#[sqlx::test(migrations = "../migrations")]
async fn a_decline_adopted_from_the_webhook_answers_as_the_decline_itself(pool: PgPool) {
    let s =
        setup(&pool, FaultConfig::default(), &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    // The event comes after the request has given up.
    let lost =
        FaultConfig { lost_response_rate: 1.0, webhook_delay_ms: 300, ..FaultConfig::default() };
    for (n, (card, code)) in DECLINE_CARDS.into_iter().enumerate() {
        s.set_faults(&FaultConfig::default()).await;
        let direct = s.decline(s.pay_with(&format!("direct-{n}"), card).await, code).await;
        // Each decline raises charge.failed and payment_intent.payment_failed.
        let events = 4 * i64::try_from(n).unwrap();
        until_received(&pool, events + 2).await;
        s.set_faults(&lost).await;
        let key = format!("lost-{n}");
        assert_problem(s.pay_with(&key, card).await, 503, "processor_unavailable").await;
        until_received(&pool, events + 4).await;
        // A call would be answered now: the count below proves none is made.
        s.set_faults(&FaultConfig::default()).await;
        let requests = s.stats().await["requests"].clone();
        let adopted = s.decline(s.pay_with(&key, card).await, code).await;
        assert_eq!(s.stats().await["requests"], requests, "adopted without a call");
        assert_eq!(adopted, direct, "{card}");
    }
    assert_eq!(adoptions(&pool, "webhook").await, 3, "each was adopted from its webhook");
}
