//! The stand-in processor, through the real client and plain HTTP: idempotency, the test tokens,
//! captures and refunds, and seeded faults.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::time::Duration;

use provider::sim::{FaultConfig, Simulator};
use provider::{
    CardProcessor, ChargeRequest, DownstreamKey, ErrorClass, FrozenRequest, ProcessorClient,
    ProcessorConfig, ProcessorError, RefundRequest,
};
use serde_json::{Value, json};

struct Sim {
    url: String,
    http: reqwest::Client,
}

async fn start(faults: FaultConfig) -> Sim {
    let simulator = Simulator::build("127.0.0.1:0", faults).await.unwrap();
    let url = format!("http://127.0.0.1:{}", simulator.port());
    tokio::spawn(simulator.run_until(std::future::pending()));
    Sim { url, http: reqwest::Client::new() }
}

impl Sim {
    fn client(&self, max_retries: u32) -> ProcessorClient {
        ProcessorClient::new(ProcessorConfig {
            base_url: self.url.clone(),
            api_key: "sk_test_sim".into(),
            connect_timeout: Duration::from_millis(500),
            request_timeout: Duration::from_millis(1000),
            max_retries,
            backoff_base: Duration::from_millis(1),
            backoff_cap: Duration::from_millis(5),
            retry_after_cap: Duration::from_millis(5),
            search_lag: Duration::ZERO,
        })
        .unwrap()
    }

    async fn post(&self, path: &str, key: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.url))
            .bearer_auth("sk_test_sim")
            .header("idempotency-key", key)
            .form(form)
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, path: &str) -> Value {
        let request = self.http.get(format!("{}{path}", self.url)).bearer_auth("sk_test_sim");
        request.send().await.unwrap().json().await.unwrap()
    }

    async fn stats(&self) -> Value {
        self.get("/_sim/stats").await
    }

    async fn set_faults(&self, faults: Value) -> reqwest::Response {
        self.http.put(format!("{}/_sim/faults", self.url)).json(&faults).send().await.unwrap()
    }
}

fn charge(payment_id: &str, source: &str) -> ChargeRequest {
    ChargeRequest {
        payment_id: payment_id.into(),
        amount: 1000,
        currency: "usd".into(),
        source: source.into(),
        capture: true,
        description: None,
        metadata: Default::default(),
    }
}

#[tokio::test]
async fn the_same_key_and_parameters_replay_the_original_charge() {
    let sim = start(FaultConfig::default()).await;
    let form = [("amount", "500"), ("currency", "usd"), ("source", "pm_card_visa")];
    let first = sim.post("/v1/charges", "k1", &form).await;
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.unwrap();
    let again = sim.post("/v1/charges", "k1", &form).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    let stats = sim.stats().await;
    assert_eq!(
        (stats["charges_created"].as_u64(), stats["idempotent_replays"].as_u64()),
        (Some(1), Some(1))
    );
}

#[tokio::test]
async fn the_same_key_with_other_parameters_is_an_idempotency_error() {
    let sim = start(FaultConfig::default()).await;
    sim.post(
        "/v1/charges",
        "k1",
        &[("amount", "500"), ("currency", "usd"), ("source", "pm_card_visa")],
    )
    .await;
    let other = sim
        .post(
            "/v1/charges",
            "k1",
            &[("amount", "501"), ("currency", "usd"), ("source", "pm_card_visa")],
        )
        .await;
    assert_eq!(other.status(), 400);
    assert_eq!(other.json::<Value>().await.unwrap()["error"]["type"], "idempotency_error");
}

#[tokio::test]
async fn every_test_token_decides_the_outcome() {
    let sim = start(FaultConfig::default()).await;
    let client = sim.client(0);
    for (n, token) in ["pm_card_visa", "pm_card_mastercard"].into_iter().enumerate() {
        let id = format!("pay_{n}");
        let made = client
            .create_charge(&charge(&id, token).freeze(DownstreamKey::charge(&id)))
            .await
            .unwrap();
        assert!(made.paid && made.captured && made.status == "succeeded", "{token}");
    }
    let declines = [
        ("pm_card_chargeDeclined", "generic_decline"),
        ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds"),
        ("pm_card_chargeDeclinedExpiredCard", "expired_card"),
    ];
    for (n, (token, expected)) in declines.into_iter().enumerate() {
        let id = format!("pay_d{n}");
        let err = client
            .create_charge(&charge(&id, token).freeze(DownstreamKey::charge(&id)))
            .await
            .unwrap_err();
        match err {
            ProcessorError::Declined { decline_code, charge_id, .. } => {
                assert_eq!(decline_code, expected);
                assert!(charge_id.is_some_and(|c| c.starts_with("ch_")));
            }
            other => panic!("{token}: {other:?}"),
        }
    }
    let err = client
        .create_charge(&charge("pay_x", "pm_card_unknown").freeze(DownstreamKey::charge("pay_x")))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProcessorError::Invalid { status: 400, ref param, .. } if param.as_deref() == Some("source"))
    );
}

#[tokio::test]
async fn captures_and_refunds_keep_the_books_straight() {
    let sim = start(FaultConfig::default()).await;
    let client = sim.client(0);
    let mut request = charge("pay_1", "pm_card_visa");
    request.capture = false;
    let authorized =
        client.create_charge(&request.freeze(DownstreamKey::charge("pay_1"))).await.unwrap();
    assert!(!authorized.captured);
    let captured = client
        .capture_charge(&FrozenRequest::capture(
            &authorized.id,
            Some(600),
            DownstreamKey::capture("pay_1"),
        ))
        .await
        .unwrap();
    assert_eq!((captured.amount_captured, captured.amount_refunded), (600, 400));

    let refund = |id: &str, amount| RefundRequest {
        charge_id: authorized.id.clone(),
        payment_id: "pay_1".into(),
        refund_id: Some(id.into()),
        amount,
        reason: None,
    };
    client
        .create_refund(&refund("re_1", Some(500)).freeze(DownstreamKey::refund("re_1")))
        .await
        .unwrap();
    let too_much = client
        .create_refund(&refund("re_2", Some(200)).freeze(DownstreamKey::refund("re_2")))
        .await
        .unwrap_err();
    assert!(
        matches!(too_much, ProcessorError::Invalid { ref code, .. } if code.as_deref() == Some("amount_too_large"))
    );
    let rest = client
        .create_refund(&refund("re_3", None).freeze(DownstreamKey::refund("re_3")))
        .await
        .unwrap();
    assert_eq!(rest.amount, 100);
    let after = client.retrieve_charge(&authorized.id).await.unwrap();
    assert!(after.refunded);

    let refunds = sim.get("/v1/refunds?limit=10").await;
    assert_eq!(refunds["data"].as_array().unwrap().len(), 2);
    assert_eq!(refunds["data"][0]["metadata"]["refund_id"], "re_3");
}

#[tokio::test]
async fn charges_are_listed_newest_first_with_their_payment_ids() {
    let sim = start(FaultConfig::default()).await;
    let client = sim.client(0);
    for n in 0..3 {
        let id = format!("pay_{n}");
        client
            .create_charge(&charge(&id, "pm_card_visa").freeze(DownstreamKey::charge(&id)))
            .await
            .unwrap();
    }
    let page = sim.get("/v1/charges?limit=2").await;
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["metadata"]["payment_id"], "pay_2");
    assert_eq!(page["data"][1]["metadata"]["payment_id"], "pay_1");
    let last = page["data"][1]["id"].as_str().unwrap();
    let rest = sim.get(&format!("/v1/charges?limit=2&starting_after={last}")).await;
    assert_eq!(rest["has_more"], false);
    assert_eq!(rest["data"][0]["metadata"]["payment_id"], "pay_0");
}

#[tokio::test]
async fn a_lost_response_still_records_the_charge_and_a_retry_returns_it() {
    let sim = start(FaultConfig { lost_response_rate: 1.0, ..FaultConfig::default() }).await;
    let client = sim.client(0);
    let key = DownstreamKey::charge("pay_lost");
    let err = client
        .create_charge(&charge("pay_lost", "pm_card_visa").freeze(key.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::UnknownOutcome, "{err:?}");
    assert_eq!(sim.stats().await["charges_created"], 1, "the charge happened");

    sim.set_faults(json!({})).await;
    let charge = client
        .create_charge(&charge("pay_lost", "pm_card_visa").freeze(key.clone()))
        .await
        .unwrap();
    let listed = sim.get("/v1/charges").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "no second charge");
    assert_eq!(listed["data"][0]["id"], charge.id.as_str());
    assert_eq!(sim.stats().await["idempotent_replays"], 1);
}

#[tokio::test]
async fn a_dropped_request_does_nothing() {
    let sim = start(FaultConfig { drop_rate: 1.0, ..FaultConfig::default() }).await;
    let err = sim
        .client(0)
        .create_charge(&charge("pay_1", "pm_card_visa").freeze(DownstreamKey::charge("pay_1")))
        .await
        .unwrap_err();
    assert_ne!(err.class(), ErrorClass::Final);
    let stats = sim.stats().await;
    assert_eq!(
        (stats["charges_created"].as_u64(), stats["faults_injected"].as_u64()),
        (Some(0), Some(1))
    );
}

#[tokio::test]
async fn the_same_seed_gives_the_same_fault_sequence() {
    let sim = start(FaultConfig::default()).await;
    let faults = json!({"seed": 7, "error_rate": 0.3, "rate_limit_rate": 0.3});
    let mut runs = Vec::new();
    for _ in 0..2 {
        let applied: Value = sim.set_faults(faults.clone()).await.json().await.unwrap();
        assert_eq!(applied["seed"], 7);
        let mut statuses = Vec::new();
        for _ in 0..30 {
            let response = sim
                .http
                .get(format!("{}/v1/charges", sim.url))
                .bearer_auth("k")
                .send()
                .await
                .unwrap();
            statuses.push(response.status().as_u16());
        }
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
    assert!(
        runs[0].contains(&500) && runs[0].contains(&429) && runs[0].contains(&200),
        "{:?}",
        runs[0]
    );
    let other: Value = sim
        .set_faults(json!({"seed": 8, "error_rate": 0.3, "rate_limit_rate": 0.3}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(other["seed"], 8);
}

#[tokio::test]
async fn server_errors_and_rate_limits_are_injected_without_acting() {
    let sim = start(FaultConfig { error_rate: 1.0, ..FaultConfig::default() }).await;
    let err = sim
        .client(1)
        .create_charge(&charge("pay_1", "pm_card_visa").freeze(DownstreamKey::charge("pay_1")))
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transient);
    assert_eq!(sim.stats().await["charges_created"], 0);
    assert_eq!(sim.stats().await["requests"], 2);
}

#[tokio::test]
async fn latency_is_added_and_faults_are_validated() {
    let sim = start(FaultConfig { latency_ms: 150, ..FaultConfig::default() }).await;
    let started = std::time::Instant::now();
    sim.get("/v1/charges").await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(sim.set_faults(json!({"error_rate": 1.5})).await.status(), 400);
    assert_eq!(sim.set_faults(json!({"bogus": 1})).await.status(), 400);
    let now: Value = sim.get("/_sim/faults").await;
    assert_eq!(now["latency_ms"], 150, "a refused change leaves the faults as they were");
}

#[tokio::test]
async fn requests_without_a_key_are_refused() {
    let sim = start(FaultConfig::default()).await;
    let response = sim.http.get(format!("{}/v1/charges", sim.url)).send().await.unwrap();
    assert_eq!(response.status(), 401);
}
