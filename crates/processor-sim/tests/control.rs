//! The stand-in as another test suite drives it over HTTP: `GET /healthz`, `POST /_sim/reset`
//! (everything, or one secret key's), faults aimed at particular requests
//! (`/_sim/faults/aimed`), and the test clock (`/_sim/clock`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use processor_sim::{FaultConfig, Simulator, WebhookTarget};
use serde_json::{Value, json};

const KEY_A: &str = "sk_test_suite_a";
const KEY_B: &str = "sk_test_suite_b";

struct Sim {
    url: String,
    http: reqwest::Client,
}

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
    /// A POST to Stripe's API with `api_key` and `key`; `Err` if the connection broke.
    async fn post_as(
        &self,
        api_key: &str,
        path: &str,
        key: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Result<(u16, bool, Value)> {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(api_key)
            .header("idempotency-key", key)
            .form(form)
            .send()
            .await?;
        let status = response.status().as_u16();
        let replayed = response.headers().get("idempotent-replayed").is_some();
        Ok((status, replayed, response.json().await?))
    }

    async fn post(&self, path: &str, key: &str, form: &[(&str, &str)]) -> (u16, bool, Value) {
        self.post_as(KEY_A, path, key, form).await.unwrap()
    }

    async fn get_as(&self, api_key: &str, path: &str) -> (u16, Value) {
        let response =
            self.http.get(format!("{}{path}", self.url)).bearer_auth(api_key).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> Value {
        self.get_as(KEY_A, path).await.1
    }

    /// A `/_sim` call with a JSON body (or none); the status and the answer.
    async fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn aim(&self, rule: Value) -> Value {
        let (status, live) =
            self.control(reqwest::Method::POST, "/_sim/faults/aimed", Some(rule)).await;
        assert_eq!(status, 200, "{live}");
        live
    }

    async fn stats(&self) -> Value {
        self.get("/_sim/stats").await
    }
}

fn charge_form<'a>(amount: &'a str, payment_id: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("amount", amount),
        ("currency", "usd"),
        ("source", "pm_card_visa"),
        ("metadata[payment_id]", payment_id),
    ]
}

#[tokio::test]
async fn healthz_answers_ok_without_a_key_and_draws_no_fault() {
    let sim = serve(FaultConfig { drop_rate: 1.0, ..FaultConfig::default() }).await;
    let response = sim.http.get(format!("{}/healthz", sim.url)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    assert_eq!(sim.stats().await["requests"], 0);
}

#[tokio::test]
async fn a_full_reset_forgets_everything_and_restores_the_start_up_faults() {
    let initial = FaultConfig { seed: 7, ..FaultConfig::default() };
    let sim = serve(initial.clone()).await;
    let (_, _, first) = sim.post("/v1/charges", "k1", &charge_form("500", "pay_1")).await;
    let id = first["id"].as_str().unwrap();
    sim.post("/v1/refunds", "r1", &[("charge", id)]).await;
    sim.control(reqwest::Method::PUT, "/_sim/faults", Some(json!({"search_lag_ms": 5}))).await;
    sim.aim(json!({"fault": "drop", "path": "/v1/refunds"})).await;
    sim.control(reqwest::Method::POST, "/_sim/clock", Some(json!({"advance_s": 60}))).await;

    let (status, answer) = sim.control(reqwest::Method::POST, "/_sim/reset", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        answer,
        json!({"scope": "all", "webhook_url": null, "removed": {
            "charges": 1, "refunds": 1, "payment_intents": 0, "idempotency_keys": 2,
            "aimed_faults": 1}})
    );
    assert_eq!(sim.get_as(KEY_A, &format!("/v1/charges/{id}")).await.0, 404);
    assert_eq!(sim.get("/v1/charges").await["data"], json!([]));
    let (_, faults) = sim.control(reqwest::Method::GET, "/_sim/faults", None).await;
    assert_eq!(faults, serde_json::to_value(&initial).unwrap());
    assert_eq!(
        sim.control(reqwest::Method::GET, "/_sim/faults/aimed", None).await.1["data"],
        json!([])
    );
    assert_eq!(sim.control(reqwest::Method::GET, "/_sim/clock", None).await.1["advanced_ms"], 0);
    // The counters start again: the GETs above were the only requests since.
    let stats = sim.stats().await;
    assert_eq!((stats["requests"].as_u64(), stats["charges_created"].as_u64()), (Some(2), Some(0)));
    // The key is forgotten: it executes again, a new charge.
    let (status, replayed, again) =
        sim.post("/v1/charges", "k1", &charge_form("500", "pay_1")).await;
    assert_eq!((status, replayed), (200, false));
    assert_ne!(again["id"], first["id"]);
    // `{}` is a full reset too.
    let (_, answer) = sim.control(reqwest::Method::POST, "/_sim/reset", Some(json!({}))).await;
    assert_eq!(answer["removed"]["charges"], 1);
}

#[tokio::test]
async fn a_reset_of_one_key_forgets_only_what_that_key_made() {
    let sim = serve(FaultConfig::default()).await;
    let (_, _, a) =
        sim.post_as(KEY_A, "/v1/charges", "k", &charge_form("500", "pay_a")).await.unwrap();
    let (_, _, b) =
        sim.post_as(KEY_B, "/v1/charges", "k", &charge_form("700", "pay_b")).await.unwrap();
    let (a_id, b_id) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    sim.post_as(KEY_A, "/v1/refunds", "ra", &[("charge", a_id)]).await.unwrap();
    sim.post_as(KEY_B, "/v1/refunds", "rb", &[("charge", b_id), ("amount", "100")]).await.unwrap();
    sim.aim(json!({"fault": "drop", "api_key": KEY_A})).await;
    sim.aim(json!({"fault": "drop", "api_key": KEY_B, "path": "/v1/nothing"})).await;

    let (status, answer) =
        sim.control(reqwest::Method::POST, "/_sim/reset", Some(json!({"api_key": KEY_A}))).await;
    assert_eq!(status, 200);
    assert_eq!(
        answer,
        json!({"scope": "api_key", "webhook_url": null, "removed": {
            "charges": 1, "refunds": 1, "payment_intents": 0, "idempotency_keys": 2,
            "aimed_faults": 1}})
    );
    assert_eq!(sim.get_as(KEY_A, &format!("/v1/charges/{a_id}")).await.0, 404);
    assert_eq!(sim.get(&format!("/v1/charges/{b_id}")).await["amount_refunded"], 100);
    let listed = sim.get("/v1/charges").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    // The indexes were built again from what is kept.
    let found = sim.get("/v1/charges/search?query=metadata['payment_id']:'pay_b'").await;
    assert_eq!(found["data"][0]["id"], b_id);
    let refunds = sim.get(&format!("/v1/refunds?charge={b_id}")).await;
    assert_eq!(refunds["data"].as_array().unwrap().len(), 1);
    // B's key still replays; A's executes again.
    let (_, replayed, b_again) =
        sim.post_as(KEY_B, "/v1/charges", "k", &charge_form("700", "pay_b")).await.unwrap();
    assert!(replayed);
    assert_eq!(b_again["id"], b_id);
    let (_, replayed, a_again) =
        sim.post_as(KEY_A, "/v1/charges", "k", &charge_form("500", "pay_a")).await.unwrap();
    assert!(!replayed, "A's aimed drop was forgotten too, and its key");
    assert_ne!(a_again["id"], a_id);
    assert_eq!(
        sim.control(reqwest::Method::GET, "/_sim/faults/aimed", None).await.1["data"][0]["api_key"],
        KEY_B
    );
    let (status, _) =
        sim.control(reqwest::Method::POST, "/_sim/reset", Some(json!({"api_key": ""}))).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn an_aimed_lost_answer_fires_on_its_idempotency_key_and_the_retry_gets_the_charge() {
    let sim = serve(FaultConfig::default()).await;
    let live = sim
        .aim(json!({"method": "POST", "path": "/v1/charges",
                    "match": {"idempotency_key": "k-lost"}, "fault": "lose_answer"}))
        .await;
    assert_eq!(
        live,
        json!({"id": "aim_1", "method": "POST", "path": "/v1/charges",
               "match": {"idempotency_key": "k-lost"}, "fault": "lose_answer", "latency_ms": 0,
               "times": 1, "fired": 0, "remaining": 1})
    );
    let (status, _, _) = sim.post("/v1/charges", "k-other", &charge_form("500", "pay_1")).await;
    assert_eq!(status, 200, "another key is served");
    let lost = sim.post_as(KEY_A, "/v1/charges", "k-lost", &charge_form("500", "pay_2")).await;
    assert!(lost.is_err(), "the answer was lost: {lost:?}");
    assert_eq!(sim.stats().await["charges_created"], 2, "the charge was made");
    let (status, replayed, charge) =
        sim.post("/v1/charges", "k-lost", &charge_form("500", "pay_2")).await;
    assert_eq!((status, replayed), (200, true), "the retry gets the charge behind the lost answer");
    assert_eq!(charge["metadata"]["payment_id"], "pay_2");
    assert_eq!(
        sim.control(reqwest::Method::GET, "/_sim/faults/aimed", None).await.1["data"],
        json!([])
    );
}

#[tokio::test]
async fn an_aimed_500_after_processing_fires_on_metadata_and_is_kept() {
    let sim = serve(FaultConfig::default()).await;
    sim.aim(
        json!({"match": {"metadata": {"payment_id": "pay_1"}}, "fault": "error_after_processing"}),
    )
    .await;
    let (status, _, _) = sim.post("/v1/charges", "k2", &charge_form("500", "pay_2")).await;
    assert_eq!(status, 200);
    let (status, replayed, body) =
        sim.post("/v1/charges", "k1", &charge_form("500", "pay_1")).await;
    assert_eq!((status, replayed, body["error"]["type"].as_str()), (500, false, Some("api_error")));
    let (status, replayed, _) = sim.post("/v1/charges", "k1", &charge_form("500", "pay_1")).await;
    assert_eq!((status, replayed), (500, true), "the key keeps the 500");
    assert_eq!(sim.stats().await["charges_created"], 2, "the charge behind the 500 was made");
}

#[tokio::test]
async fn an_aimed_error_on_a_path_with_an_id_refuses_before_acting() {
    let sim = serve(FaultConfig::default()).await;
    let form =
        [("amount", "500"), ("currency", "usd"), ("source", "pm_card_visa"), ("capture", "false")];
    let (_, _, charge) = sim.post("/v1/charges", "k1", &form).await;
    let id = charge["id"].as_str().unwrap();
    sim.aim(json!({"path": "/v1/charges/{id}/capture", "fault": "error"})).await;
    let capture = format!("/v1/charges/{id}/capture");
    let (status, _, _) = sim.post(&capture, "c1", &[]).await;
    assert_eq!(status, 500);
    assert_eq!(sim.get(&format!("/v1/charges/{id}")).await["captured"], false);
    let (status, replayed, captured) = sim.post(&capture, "c1", &[]).await;
    assert_eq!((status, replayed, captured["captured"].as_bool()), (200, false, Some(true)));
}

#[tokio::test]
async fn an_aimed_rule_fires_its_times_then_is_spent() {
    let sim = serve(FaultConfig::default()).await;
    sim.aim(json!({"method": "get", "path": "/v1/charges", "fault": "rate_limit", "times": 2}))
        .await;
    assert_eq!(sim.get_as(KEY_A, "/v1/charges").await.0, 429);
    let (_, rules) = sim.control(reqwest::Method::GET, "/_sim/faults/aimed", None).await;
    assert_eq!(
        (rules["data"][0]["fired"].as_u64(), rules["data"][0]["remaining"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(sim.get_as(KEY_A, "/v1/charges/search?query=x").await.0, 400, "another path");
    assert_eq!(sim.get_as(KEY_A, "/v1/charges").await.0, 429);
    assert_eq!(sim.get_as(KEY_A, "/v1/charges").await.0, 200);
    assert_eq!(sim.stats().await["faults_injected"], 2);
}

#[tokio::test]
async fn an_aimed_drop_fires_on_a_parameter_and_does_nothing() {
    let sim = serve(FaultConfig::default()).await;
    sim.aim(json!({"match": {"param": {"name": "amount", "value": "500"}}, "fault": "drop"})).await;
    let (status, _, _) = sim.post("/v1/charges", "k6", &charge_form("600", "pay_1")).await;
    assert_eq!(status, 200);
    assert!(sim.post_as(KEY_A, "/v1/charges", "k5", &charge_form("500", "pay_2")).await.is_err());
    assert_eq!(sim.stats().await["charges_created"], 1, "nothing was done");
    let (status, replayed, _) = sim.post("/v1/charges", "k5", &charge_form("500", "pay_2")).await;
    assert_eq!((status, replayed), (200, false), "the retry executes");
}

#[tokio::test]
async fn an_aimed_rule_takes_precedence_over_the_drawn_faults_and_keeps_to_its_key() {
    let sim = serve(FaultConfig { error_rate: 1.0, ..FaultConfig::default() }).await;
    sim.aim(json!({"api_key": KEY_B, "path": "/v1/charges", "fault": "latency", "latency_ms": 200, "times": 5}))
        .await;
    let started = Instant::now();
    assert_eq!(sim.get_as(KEY_B, "/v1/charges").await.0, 200, "the rule, not the drawn 500");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(sim.get_as(KEY_A, "/v1/charges").await.0, 500, "another key draws");
}

#[tokio::test]
async fn a_rule_the_stand_in_cannot_carry_out_is_refused_and_rules_can_be_cleared() {
    let sim = serve(FaultConfig::default()).await;
    for bad in [
        json!({"fault": "latency"}),
        json!({"fault": "error_after_processing", "method": "GET"}),
        json!({"fault": "drop", "times": 0}),
        json!({"fault": "drop", "match": {"amount": "5"}}),
        json!({"fault": "explode"}),
    ] {
        let (status, body) =
            sim.control(reqwest::Method::POST, "/_sim/faults/aimed", Some(bad.clone())).await;
        assert_eq!(
            (status, body["error"]["type"].as_str()),
            (400, Some("invalid_request_error")),
            "{bad}"
        );
    }
    sim.aim(json!({"fault": "drop"})).await;
    sim.aim(json!({"fault": "error"})).await;
    let (_, cleared) = sim.control(reqwest::Method::DELETE, "/_sim/faults/aimed", None).await;
    assert_eq!(cleared, json!({"removed": 2}));
    assert_eq!(sim.get_as(KEY_A, "/v1/charges").await.0, 200);
}

#[tokio::test]
async fn the_clock_moves_key_expiry_the_search_lag_and_created() {
    let faults = FaultConfig { key_ttl_s: 60, search_lag_ms: 10_000, ..FaultConfig::default() };
    let sim = serve(faults).await;
    let (_, before) = sim.control(reqwest::Method::GET, "/_sim/clock", None).await;
    let (_, _, first) = sim.post("/v1/charges", "k1", &charge_form("500", "pay_1")).await;
    let query = "/v1/charges/search?query=metadata['payment_id']:'pay_1'";
    assert_eq!(sim.get(query).await["data"], json!([]), "within the lag");

    let (status, after) =
        sim.control(reqwest::Method::POST, "/_sim/clock", Some(json!({"advance_s": 3600}))).await;
    assert_eq!(status, 200);
    assert_eq!(after["advanced_ms"], 3_600_000);
    let moved = after["now"].as_u64().unwrap() - before["now"].as_u64().unwrap();
    assert!((3600..3660).contains(&moved), "{moved}");
    assert_eq!(sim.get(query).await["data"][0]["id"], first["id"], "past the lag");

    let (_, replayed, again) = sim.post("/v1/charges", "k1", &charge_form("500", "pay_1")).await;
    assert!(!replayed, "the key expired");
    assert_ne!(again["id"], first["id"]);
    assert!(again["created"].as_u64().unwrap() >= after["now"].as_u64().unwrap());
    assert!(first["created"].as_u64().unwrap() < after["now"].as_u64().unwrap());
    assert_eq!(sim.stats().await["keys_expired"], 1);

    let (status, _) =
        sim.control(reqwest::Method::POST, "/_sim/clock", Some(json!({"advance_s": -1}))).await;
    assert_eq!(status, 400, "the clock never goes back");
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

#[tokio::test]
async fn a_full_reset_forgets_the_webhooks_not_yet_delivered_but_keeps_the_target() {
    let (url, received) = webhook_receiver().await;
    let (sim, simulator) =
        start(FaultConfig { webhook_delay_ms: 300, ..FaultConfig::default() }).await;
    simulator
        .set_webhook_target(Some(WebhookTarget {
            url: url.clone(),
            secret: "whsec_0123456789".into(),
        }))
        .unwrap();
    tokio::spawn(simulator.run_until(std::future::pending()));
    sim.post("/v1/charges", "k1", &charge_form("500", "pay_1")).await;
    let (_, answer) = sim.control(reqwest::Method::POST, "/_sim/reset", None).await;
    assert_eq!(answer["webhook_url"], url.as_str());
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(received.lock().unwrap().is_empty(), "the event raised before the reset was not sent");

    sim.post("/v1/charges", "k2", &charge_form("500", "pay_2")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while received.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the event raised after the reset never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let event = received.lock().unwrap()[0].clone();
    assert_eq!(event["data"]["object"]["metadata"]["payment_id"], "pay_2");

    let (_, answer) = sim
        .control(reqwest::Method::POST, "/_sim/reset", Some(json!({"webhook_target": true})))
        .await;
    assert_eq!(answer["webhook_url"], Value::Null);
    let (_, target) = sim.control(reqwest::Method::GET, "/_sim/webhooks", None).await;
    assert_eq!(target["url"], Value::Null);
}
