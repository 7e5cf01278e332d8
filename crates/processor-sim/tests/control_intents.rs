//! The driving surface (`/_sim/reset`, `/_sim/faults/aimed`, `/_sim/clock`) on PaymentIntents:
//! a reset of one key forgets that key's intents and their pending authentications and keeps the
//! others' whole; a full reset forgets them all; aimed faults fire on the intent routes; the HTTP
//! clock moves authentication expiry and the `created` of webhook events.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use processor_sim::{FaultConfig, Simulator, WebhookTarget};
use serde_json::{Value, json};

const KEY_A: &str = "sk_test_suite_a";
const KEY_B: &str = "sk_test_suite_b";
const THREE_D_SECURE: &str = "pm_card_threeDSecure2Required";

struct Sim {
    url: String,
    http: reqwest::Client,
}

/// An answer: its status, whether it was replayed, its body.
type Answered = (u16, bool, Value);

async fn start(faults: FaultConfig) -> (Sim, Simulator) {
    let simulator = Simulator::build("127.0.0.1:0", faults).await.unwrap();
    let url = format!("http://127.0.0.1:{}", simulator.port());
    (Sim { url, http: reqwest::Client::new() }, simulator)
}

async fn serve(faults: FaultConfig) -> Sim {
    let (sim, simulator) = start(faults).await;
    tokio::spawn(simulator.run_until(std::future::pending()));
    sim
}

impl Sim {
    /// A POST to Stripe's API; `Err` if the connection broke.
    async fn try_post(
        &self,
        api_key: &str,
        path: &str,
        key: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Result<Answered> {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(api_key)
            .header("idempotency-key", key)
            .form(form)
            .send()
            .await?;
        let status = response.status().as_u16();
        let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        Ok((status, replayed, response.json().await?))
    }

    async fn post(&self, api_key: &str, path: &str, key: &str, form: &[(&str, &str)]) -> Answered {
        self.try_post(api_key, path, key, form).await.unwrap()
    }

    /// Creates and confirms a card-only intent of 1000 with `card` as `api_key`, tagged
    /// `metadata[payment_id]=key`; `extra` adds parameters.
    async fn pay(&self, api_key: &str, key: &str, card: &str, extra: &[(&str, &str)]) -> Value {
        let (status, _, intent) =
            self.try_pay(api_key, key, card, extra).await.expect("the answer came");
        assert_eq!(status, 200, "{intent}");
        intent
    }

    async fn try_pay(
        &self,
        api_key: &str,
        key: &str,
        card: &str,
        extra: &[(&str, &str)],
    ) -> reqwest::Result<Answered> {
        let mut form = vec![
            ("amount", "1000"),
            ("currency", "usd"),
            ("payment_method", card),
            ("confirm", "true"),
            ("payment_method_types[]", "card"),
            ("metadata[payment_id]", key),
        ];
        form.extend_from_slice(extra);
        self.try_post(api_key, "/v1/payment_intents", key, &form).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response =
            self.http.get(format!("{}{path}", self.url)).bearer_auth(KEY_A).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn intent(&self, id: &str) -> (u16, Value) {
        self.get(&format!("/v1/payment_intents/{id}")).await
    }

    /// A `/_sim` call with a JSON body; the status and the answer.
    async fn control(&self, path: &str, body: Value) -> (u16, Value) {
        let response =
            self.http.post(format!("{}{path}", self.url)).json(&body).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn authenticate(&self, id: &str, outcome: &str) -> Value {
        let path = format!("/_sim/payment_intents/{id}/authenticate");
        let (status, intent) = self.control(&path, json!({ "outcome": outcome })).await;
        assert_eq!(status, 200, "{intent}");
        intent
    }

    async fn aim(&self, rule: Value) {
        let (status, live) = self.control("/_sim/faults/aimed", rule).await;
        assert_eq!(status, 200, "{live}");
    }

    async fn stats(&self) -> Value {
        self.get("/_sim/stats").await.1
    }
}

fn id(object: &Value) -> String {
    object["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_reset_of_one_key_forgets_its_payment_intents_and_their_pending_authentications() {
    let faults = FaultConfig { authentication_ttl_s: 60, ..FaultConfig::default() };
    let sim = serve(faults).await;
    let a_paid = sim.pay(KEY_A, "pay_a", "pm_card_visa", &[]).await;
    let a_waiting = sim.pay(KEY_A, "pay_a3", THREE_D_SECURE, &[]).await;
    // B's authentication begins later than A's: its place in the expiry queue is its own.
    sim.control("/_sim/clock", json!({"advance_s": 1})).await;
    let b_held = sim.pay(KEY_B, "pay_b", "pm_card_visa", &[("capture_method", "manual")]).await;
    let b_waiting = sim.pay(KEY_B, "pay_b3", THREE_D_SECURE, &[]).await;
    assert_eq!(a_waiting["status"], "requires_action");

    let (status, answer) = sim.control("/_sim/reset", json!({"api_key": KEY_A})).await;
    assert_eq!(status, 200);
    assert_eq!(
        answer["removed"],
        json!({"charges": 1, "refunds": 0, "payment_intents": 2, "idempotency_keys": 2,
               "aimed_faults": 0})
    );
    for forgotten in [&a_paid, &a_waiting] {
        assert_eq!(sim.intent(&id(forgotten)).await.0, 404);
    }
    let listed = sim.get("/v1/payment_intents").await.1;
    let ids: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [id(&b_waiting), id(&b_held)]);
    // The indexes were built again: B's intents are found by id, by search, and act as before.
    let (_, found) =
        sim.get("/v1/payment_intents/search?query=metadata['payment_id']:'pay_b'").await;
    assert_eq!(found["data"][0]["id"], id(&b_held));
    let capture = format!("/v1/payment_intents/{}/capture", id(&b_held));
    let (status, _, captured) = sim.post(KEY_B, &capture, "cap_b", &[]).await;
    assert_eq!((status, &captured["status"]), (200, &json!("succeeded")));
    // A's pending authentication is gone; B's still expires, at its new position.
    sim.control("/_sim/clock", json!({"advance_s": 60})).await;
    let (_, expired) = sim.intent(&id(&b_waiting)).await;
    assert_eq!(expired["status"], "requires_payment_method");
    assert_eq!(expired["last_payment_error"]["code"], "payment_intent_authentication_failure");
    assert_eq!(sim.stats().await["authentications_expired"], 1);
    // A's key executes again.
    let again = sim.pay(KEY_A, "pay_a", "pm_card_visa", &[]).await;
    assert_ne!(again["id"], a_paid["id"]);
}

#[tokio::test]
async fn an_authentication_completed_outside_a_request_makes_a_charge_of_the_intents_key() {
    let sim = serve(FaultConfig::default()).await;
    let waiting = sim.pay(KEY_A, "pay_a", THREE_D_SECURE, &[]).await;
    // B's request comes last before the authentication is completed at the control route.
    let b_charge = [("amount", "700"), ("currency", "usd"), ("source", "pm_card_visa")];
    sim.post(KEY_B, "/v1/charges", "ch_b", &b_charge).await;
    let done = sim.authenticate(&id(&waiting), "complete").await;
    let charge = done["latest_charge"].as_str().unwrap().to_owned();

    let (_, answer) = sim.control("/_sim/reset", json!({"api_key": KEY_B})).await;
    assert_eq!(answer["removed"]["charges"], 1, "only B's own charge: {answer}");
    assert_eq!(sim.get(&format!("/v1/charges/{charge}")).await.0, 200);
    let (_, answer) = sim.control("/_sim/reset", json!({"api_key": KEY_A})).await;
    assert_eq!(
        (&answer["removed"]["charges"], &answer["removed"]["payment_intents"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(sim.get(&format!("/v1/charges/{charge}")).await.0, 404);
}

#[tokio::test]
async fn a_full_reset_forgets_every_payment_intent_and_pending_authentication() {
    let (url, received) = webhook_receiver().await;
    let faults = FaultConfig { authentication_ttl_s: 60, ..FaultConfig::default() };
    let (sim, simulator) = start(faults).await;
    simulator.set_webhook_target(Some(target(&url))).unwrap();
    tokio::spawn(simulator.run_until(std::future::pending()));
    let paid = sim.pay(KEY_A, "pay_1", "pm_card_visa", &[]).await;
    let waiting = sim.pay(KEY_B, "pay_2", THREE_D_SECURE, &[]).await;
    wait_for(&received, 3).await; // charge.succeeded, payment_intent.succeeded, .requires_action

    let (_, answer) = sim.control("/_sim/reset", json!({})).await;
    assert_eq!(
        answer["removed"],
        json!({"charges": 1, "refunds": 0, "payment_intents": 2, "idempotency_keys": 2,
               "aimed_faults": 0})
    );
    for forgotten in [&paid, &waiting] {
        assert_eq!(sim.intent(&id(forgotten)).await.0, 404);
    }
    assert_eq!(sim.get("/v1/payment_intents").await.1["data"], json!([]));
    sim.control("/_sim/clock", json!({"advance_s": 120})).await;
    sim.get("/v1/payment_intents").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sim.stats().await["authentications_expired"], 0);
    assert_eq!(received.lock().unwrap().len(), 3, "no payment_failed for a forgotten intent");
}

#[tokio::test]
async fn the_http_clock_moves_authentication_expiry() {
    let faults = FaultConfig { authentication_ttl_s: 600, ..FaultConfig::default() };
    let sim = serve(faults).await;
    let waiting = sim.pay(KEY_A, "pay_1", THREE_D_SECURE, &[]).await;
    let (status, _) = sim.control("/_sim/clock", json!({"advance_s": 590})).await;
    assert_eq!(status, 200);
    assert_eq!(sim.intent(&id(&waiting)).await.1["status"], "requires_action");
    sim.control("/_sim/clock", json!({"advance_s": 10})).await;
    let (_, expired) = sim.intent(&id(&waiting)).await;
    assert_eq!(
        (&expired["status"], &expired["last_payment_error"]["code"]),
        (&json!("requires_payment_method"), &json!("payment_intent_authentication_failure"))
    );
    assert_eq!(sim.stats().await["authentications_expired"], 1);
}

#[tokio::test]
async fn an_aimed_fault_on_a_path_with_an_id_fires_on_a_payment_intent_capture() {
    let sim = serve(FaultConfig::default()).await;
    let held = sim.pay(KEY_A, "pay_1", "pm_card_visa", &[("capture_method", "manual")]).await;
    let other = sim.pay(KEY_A, "pay_2", "pm_card_visa", &[("capture_method", "manual")]).await;
    sim.aim(json!({"path": "/v1/payment_intents/{id}/capture", "fault": "error_after_processing"}))
        .await;
    let capture = format!("/v1/payment_intents/{}/capture", id(&held));
    let (status, replayed, body) = sim.post(KEY_A, &capture, "cap_1", &[]).await;
    assert_eq!((status, replayed, &body["error"]["type"]), (500, false, &json!("api_error")));
    assert_eq!(sim.intent(&id(&held)).await.1["status"], "succeeded", "the capture was made");
    let (status, replayed, _) = sim.post(KEY_A, &capture, "cap_1", &[]).await;
    assert_eq!((status, replayed), (500, true), "the key keeps the 500");
    // Spent after one: the next capture is served.
    let capture = format!("/v1/payment_intents/{}/capture", id(&other));
    let (status, _, captured) = sim.post(KEY_A, &capture, "cap_2", &[]).await;
    assert_eq!((status, &captured["status"]), (200, &json!("succeeded")));
}

#[tokio::test]
async fn an_aimed_lost_answer_fires_on_the_metadata_of_a_payment_intent_create() {
    let sim = serve(FaultConfig::default()).await;
    sim.aim(json!({"method": "POST", "path": "/v1/payment_intents",
                   "match": {"metadata": {"payment_id": "pay_lost"}}, "fault": "lose_answer"}))
        .await;
    sim.pay(KEY_A, "pay_other", "pm_card_visa", &[]).await;
    let lost = sim.try_pay(KEY_A, "pay_lost", "pm_card_visa", &[]).await;
    assert!(lost.is_err(), "the answer was lost: {lost:?}");
    let listed = sim.get("/v1/payment_intents").await.1;
    assert_eq!(listed["data"][0]["metadata"]["payment_id"], "pay_lost", "the intent was made");
    let (status, replayed, intent) =
        sim.try_pay(KEY_A, "pay_lost", "pm_card_visa", &[]).await.unwrap();
    assert_eq!((status, replayed, &intent["id"]), (200, true, &listed["data"][0]["id"]));
    assert_eq!(intent["status"], "succeeded");
    assert_eq!(sim.stats().await["payment_intents_created"], 2);
}

/// Bodies of the webhooks an endpoint received.
type Received = Arc<Mutex<Vec<Value>>>;

async fn webhook_receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let keep = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn target(url: &str) -> WebhookTarget {
    WebhookTarget { url: url.to_owned(), secret: "whsec_0123456789".into() }
}

/// Waits until `count` events have arrived; all of them, in arrival order.
async fn wait_for(received: &Received, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = received.lock().unwrap().clone();
        if events.len() >= count {
            return events;
        }
        assert!(Instant::now() < deadline, "only {} of {count} events came", events.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn webhook_events_are_created_on_the_stand_ins_clock() {
    let (url, received) = webhook_receiver().await;
    let (sim, simulator) = start(FaultConfig::default()).await;
    simulator.set_webhook_target(Some(target(&url))).unwrap();
    tokio::spawn(simulator.run_until(std::future::pending()));
    let day_s = 24 * 60 * 60;
    let (_, clock) = sim.control("/_sim/clock", json!({"advance_s": day_s})).await;
    let now = clock["now"].as_u64().unwrap();
    let waiting = sim.pay(KEY_A, "pay_1", THREE_D_SECURE, &[]).await;
    let done = sim.authenticate(&id(&waiting), "complete").await;
    let events = wait_for(&received, 3).await;
    for event in &events {
        let created = event["created"].as_u64().unwrap();
        assert!((now..now + 60).contains(&created), "{created} is not near {now}: {event}");
    }
    assert!(done["created"].as_u64().unwrap() >= now);
}
