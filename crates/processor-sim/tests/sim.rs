//! The stand-in processor, through plain HTTP (its charge routes, which older integrations still
//! call) and the real client's PaymentIntent calls (its faults as the client sees them):
//! idempotency (strict as Stripe, and lenient), the test tokens, captures and refunds, search,
//! and seeded faults.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::time::Duration;

use processor_sim::{FaultConfig, Idempotency, ManualClock, Simulator};
use provider::{
    CardProcessor, Charge, DownstreamKey, ErrorClass, FrozenRequest, PaymentIntentRequest,
    ProcessorClient, ProcessorConfig, RefundRequest,
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

/// Starts the stand-in on a clock the test moves.
async fn start_with_clock(faults: FaultConfig) -> (Sim, ManualClock) {
    let clock = ManualClock::new();
    let simulator =
        Simulator::build_with_clock("127.0.0.1:0", faults, clock.clone()).await.unwrap();
    let url = format!("http://127.0.0.1:{}", simulator.port());
    tokio::spawn(simulator.run_until(std::future::pending()));
    (Sim { url, http: reqwest::Client::new() }, clock)
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
            stripe_version: None,
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

    /// Sends a frozen request as the client would, once, through plain HTTP.
    async fn post_frozen(&self, frozen: &FrozenRequest) -> reqwest::Response {
        self.http
            .post(format!("{}{}", self.url, frozen.path))
            .bearer_auth("sk_test_sim")
            .header("idempotency-key", frozen.key.as_str())
            .form(&frozen.form)
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

/// A charge of 1000 for `payment_id` with card `source`, created through plain HTTP under the
/// payment's key, as an older integration does.
async fn charge_of(sim: &Sim, payment_id: &str, source: &str, capture: bool) -> reqwest::Response {
    let capture = capture.to_string();
    let form = [
        ("amount", "1000"),
        ("currency", "usd"),
        ("source", source),
        ("capture", capture.as_str()),
        ("metadata[payment_id]", payment_id),
    ];
    sim.post("/v1/charges", &format!("{payment_id}/charge"), &form).await
}

/// The charge a 200 answered.
async fn charge_in(response: reqwest::Response) -> Charge {
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// A PaymentIntent of 1000 for `payment_id`, to create and confirm with the client.
fn intent(payment_id: &str) -> FrozenRequest {
    PaymentIntentRequest {
        payment_id: payment_id.into(),
        amount: 1000,
        currency: "usd".into(),
        payment_method: "pm_card_visa".into(),
        capture: true,
        description: None,
        metadata: Default::default(),
        return_url: "https://pay.example.com/return".into(),
    }
    .freeze(DownstreamKey::charge(payment_id))
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
    for (n, token) in ["pm_card_visa", "pm_card_mastercard"].into_iter().enumerate() {
        let made = charge_in(charge_of(&sim, &format!("pay_{n}"), token, true).await).await;
        assert!(made.paid && made.captured && made.status == "succeeded", "{token}");
        let outcome = made.outcome.unwrap();
        assert_eq!((outcome.type_.as_deref(), outcome.reason), (Some("authorized"), None));
    }
    let declines = [
        ("pm_card_chargeDeclined", "generic_decline"),
        ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds"),
        ("pm_card_chargeDeclinedExpiredCard", "expired_card"),
    ];
    for (n, (token, expected)) in declines.into_iter().enumerate() {
        let response = charge_of(&sim, &format!("pay_d{n}"), token, true).await;
        assert_eq!(response.status(), 402, "{token}");
        let error = response.json::<Value>().await.unwrap()["error"].clone();
        assert_eq!(error["type"], "card_error", "{token}");
        assert_eq!(error["decline_code"], expected, "{token}");
        let charge_id = error["charge"].as_str().unwrap();
        assert!(charge_id.starts_with("ch_"));
        // The declined charge says what the 402 said, as Stripe's does: the error's code and
        // message, and the decline code as the outcome's reason.
        let declined: Charge =
            serde_json::from_value(sim.get(&format!("/v1/charges/{charge_id}")).await).unwrap();
        assert_eq!(declined.decline_code(), expected, "{token}");
        assert_eq!(declined.failure_message.as_deref(), error["message"].as_str());
        let outcome = declined.outcome.unwrap();
        assert_eq!(outcome.type_.as_deref(), Some("issuer_declined"));
        assert_eq!(outcome.network_status.as_deref(), Some("declined_by_network"));
    }
    let unknown = charge_of(&sim, "pay_x", "pm_card_unknown", true).await;
    assert_eq!(unknown.status(), 400);
    let error = unknown.json::<Value>().await.unwrap()["error"].clone();
    assert_eq!(
        (&error["type"], &error["param"]),
        (&json!("invalid_request_error"), &json!("source"))
    );
}

/// Stripe's charge carries the error's code as `failure_code` and the decline code as
/// `outcome.reason`, on the charge retrieved, listed, searched and in its event alike.
#[tokio::test]
async fn a_charge_carries_stripes_outcome_on_the_wire() {
    let sim = start(FaultConfig::default()).await;
    let form = [
        ("amount", "500"),
        ("currency", "usd"),
        ("source", "pm_card_chargeDeclinedInsufficientFunds"),
        ("metadata[payment_id]", "pay_if"),
    ];
    let declined: Value = sim.post("/v1/charges", "k1", &form).await.json().await.unwrap();
    assert_eq!(declined["error"]["code"], "card_declined");
    assert_eq!(declined["error"]["decline_code"], "insufficient_funds");
    let id = declined["error"]["charge"].as_str().unwrap();
    let charge = sim.get(&format!("/v1/charges/{id}")).await;
    assert_eq!(charge["failure_code"], "card_declined");
    assert_eq!(charge["failure_message"], declined["error"]["message"]);
    assert_eq!(
        charge["outcome"],
        json!({"network_status": "declined_by_network", "reason": "insufficient_funds",
               "risk_level": "normal", "type": "issuer_declined",
               "seller_message": "The bank returned the decline code `insufficient_funds`."})
    );
    let searched = sim.get("/v1/charges/search?query=metadata['payment_id']:'pay_if'").await;
    assert_eq!(searched["data"][0], charge);
    assert_eq!(sim.get("/v1/charges").await["data"][0], charge);

    let form = [("amount", "500"), ("currency", "usd"), ("source", "pm_card_visa")];
    let paid: Value = sim.post("/v1/charges", "k2", &form).await.json().await.unwrap();
    assert_eq!((&paid["failure_code"], &paid["failure_message"]), (&Value::Null, &Value::Null));
    assert_eq!(
        paid["outcome"],
        json!({"network_status": "approved_by_network", "reason": null, "risk_level": "normal",
               "seller_message": "Payment complete.", "type": "authorized"})
    );
}

#[tokio::test]
async fn captures_and_refunds_keep_the_books_straight() {
    let sim = start(FaultConfig::default()).await;
    let authorized = charge_in(charge_of(&sim, "pay_1", "pm_card_visa", false).await).await;
    assert!(!authorized.captured);
    let capture = FrozenRequest {
        path: format!("/v1/charges/{}/capture", authorized.id),
        form: vec![("amount".to_owned(), "600".to_owned())],
        key: DownstreamKey::capture("pay_1", 1),
    };
    let captured = charge_in(sim.post_frozen(&capture).await).await;
    assert_eq!((captured.amount_captured, captured.amount_refunded), (600, 400));

    let refund = |id: &str, amount| {
        RefundRequest {
            charge_id: Some(authorized.id.clone()),
            payment_intent: None,
            payment_id: "pay_1".into(),
            refund_id: Some(id.into()),
            amount,
            reason: None,
        }
        .freeze(DownstreamKey::refund(id))
    };
    assert_eq!(sim.post_frozen(&refund("re_1", Some(500))).await.status(), 200);
    let too_much = sim.post_frozen(&refund("re_2", Some(200))).await;
    assert_eq!(too_much.status(), 400);
    let error = too_much.json::<Value>().await.unwrap()["error"].clone();
    assert_eq!(
        (&error["type"], &error["code"]),
        (&json!("invalid_request_error"), &json!("amount_too_large"))
    );
    let rest: Value = sim.post_frozen(&refund("re_3", None)).await.json().await.unwrap();
    assert_eq!(rest["amount"], 100);
    let after: Charge =
        serde_json::from_value(sim.get(&format!("/v1/charges/{}", authorized.id)).await).unwrap();
    assert!(after.refunded);

    let refunds = sim.get("/v1/refunds?limit=10").await;
    assert_eq!(refunds["data"].as_array().unwrap().len(), 2);
    assert_eq!(refunds["data"][0]["metadata"]["refund_id"], "re_3");
}

#[tokio::test]
async fn charges_are_listed_newest_first_with_their_payment_ids() {
    let sim = start(FaultConfig::default()).await;
    for n in 0..3 {
        charge_in(charge_of(&sim, &format!("pay_{n}"), "pm_card_visa", true).await).await;
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
async fn a_lost_response_still_records_the_payment_and_a_retry_returns_it() {
    let sim = start(FaultConfig { lost_response_rate: 1.0, ..FaultConfig::default() }).await;
    let client = sim.client(0);
    let err = client.create_payment_intent(&intent("pay_lost")).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::UnknownOutcome, "{err:?}");
    let stats = sim.stats().await;
    assert_eq!(
        (stats["payment_intents_created"].as_u64(), stats["charges_created"].as_u64()),
        (Some(1), Some(1)),
        "the payment happened"
    );

    sim.set_faults(json!({})).await;
    let made = client.create_payment_intent(&intent("pay_lost")).await.unwrap();
    let listed = sim.get("/v1/payment_intents").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "no second PaymentIntent");
    assert_eq!(listed["data"][0]["id"], made.id.as_str());
    let charges = sim.get("/v1/charges").await;
    assert_eq!(charges["data"].as_array().unwrap().len(), 1, "no second charge");
    assert_eq!(Some(charges["data"][0]["id"].as_str().unwrap()), made.latest_charge.as_deref());
    assert_eq!(sim.stats().await["idempotent_replays"], 1);
}

#[tokio::test]
async fn a_dropped_request_does_nothing() {
    let sim = start(FaultConfig { drop_rate: 1.0, ..FaultConfig::default() }).await;
    let err = sim.client(0).create_payment_intent(&intent("pay_1")).await.unwrap_err();
    assert_ne!(err.class(), ErrorClass::Final);
    let stats = sim.stats().await;
    assert_eq!(
        (
            stats["payment_intents_created"].as_u64(),
            stats["charges_created"].as_u64(),
            stats["faults_injected"].as_u64()
        ),
        (Some(0), Some(0), Some(1))
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
    let err = sim.client(1).create_payment_intent(&intent("pay_1")).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Transient);
    assert_eq!(sim.stats().await["payment_intents_created"], 0);
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

const VISA_500: [(&str, &str); 3] =
    [("amount", "500"), ("currency", "usd"), ("source", "pm_card_visa")];

/// A charge of 1000 with `metadata[payment_id]` (and more metadata), through plain HTTP.
async fn charge_with(sim: &Sim, key: &str, metadata: &[(&str, &str)], capture: bool) -> Value {
    let mut form = vec![("amount", "1000"), ("currency", "usd"), ("source", "pm_card_visa")];
    if !capture {
        form.push(("capture", "false"));
    }
    let names: Vec<String> = metadata.iter().map(|(k, _)| format!("metadata[{k}]")).collect();
    form.extend(names.iter().map(String::as_str).zip(metadata.iter().map(|(_, v)| *v)));
    let response = sim.post("/v1/charges", key, &form).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn status_and_body(response: reqwest::Response) -> (u16, bool, Value) {
    let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    (response.status().as_u16(), replayed, response.json().await.unwrap())
}

#[tokio::test]
async fn an_error_the_operation_raised_is_kept_and_replayed() {
    let sim = start(FaultConfig::default()).await;
    let charge = charge_with(&sim, "c1", &[("payment_id", "pay_1")], false).await;
    let path = format!("/v1/charges/{}/capture", charge["id"].as_str().unwrap());
    let first = status_and_body(sim.post(&path, "cap", &[("amount", "2000")]).await).await;
    assert_eq!((first.0, first.1), (400, false));
    assert_eq!(first.2["error"]["code"], "amount_too_large");
    let again = status_and_body(sim.post(&path, "cap", &[("amount", "2000")]).await).await;
    assert_eq!(again, (400, true, first.2), "the kept 400, replayed");

    let missing = status_and_body(sim.post("/v1/charges/ch_nope/capture", "gone", &[]).await).await;
    assert_eq!((missing.0, missing.1), (404, false));
    let missing_again = sim.post("/v1/charges/ch_nope/capture", "gone", &[]).await;
    assert_eq!(missing_again.headers()["idempotent-replayed"], "true");
    assert_eq!(sim.stats().await["idempotent_replays"], 2);
}

#[tokio::test]
async fn a_refusal_on_the_parameters_keeps_nothing_so_a_corrected_retry_executes() {
    let sim = start(FaultConfig::default()).await;
    let refused = sim.post("/v1/charges", "k", &[("currency", "usd"), ("source", "pm_card_visa")]);
    let (status, _, body) = status_and_body(refused.await).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("parameter_missing")));
    let corrected = status_and_body(sim.post("/v1/charges", "k", &VISA_500).await).await;
    assert_eq!((corrected.0, corrected.1), (200, false), "{:?}", corrected.2);
    assert_eq!(sim.stats().await["idempotency_errors"], 0);
}

#[tokio::test]
async fn a_decline_is_kept_and_replayed_with_the_same_charge() {
    let sim = start(FaultConfig::default()).await;
    let form = [("amount", "500"), ("currency", "usd"), ("source", "pm_card_chargeDeclined")];
    let first = status_and_body(sim.post("/v1/charges", "d", &form).await).await;
    assert_eq!((first.0, first.1), (402, false));
    let again = status_and_body(sim.post("/v1/charges", "d", &form).await).await;
    assert_eq!(again, (402, true, first.2));
    assert_eq!(sim.stats().await["charges_created"], 1);
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_or_on_another_path_gets_stripes_idempotency_error() {
    let sim = start(FaultConfig::default()).await;
    sim.post("/v1/charges", "reused", &VISA_500).await;
    let other_amount = [("amount", "501"), ("currency", "usd"), ("source", "pm_card_visa")];
    let (status, replayed, body) =
        status_and_body(sim.post("/v1/charges", "reused", &other_amount).await).await;
    assert_eq!((status, replayed), (400, false));
    assert_eq!(
        body,
        json!({"error": {
            "type": "idempotency_error",
            "message": "Keys for idempotent requests can only be used with the same parameters \
                        they were first used with. Try using a key other than 'reused' if you \
                        meant to execute a different request.",
        }}),
        "Stripe's body, with no code"
    );
    let other_path = sim.post("/v1/refunds", "reused", &VISA_500).await;
    assert_eq!(other_path.status(), 400);
    assert_eq!(other_path.json::<Value>().await.unwrap()["error"]["type"], "idempotency_error");
    let stats = sim.stats().await;
    assert_eq!(
        (stats["idempotency_errors"].as_u64(), stats["charges_created"].as_u64()),
        (Some(2), Some(1))
    );
}

#[tokio::test]
async fn a_500_after_processing_is_kept_against_the_key_and_replayed_ever_after() {
    let faults = FaultConfig { error_after_processing_rate: 1.0, ..FaultConfig::default() };
    let sim = start(faults).await;
    let first = sim.post("/v1/charges", "k", &VISA_500).await;
    assert_eq!(first.status(), 500);
    assert_eq!(first.headers()["stripe-should-retry"], "false");
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["error"]["type"], "api_error");

    sim.set_faults(json!({})).await;
    let listed = sim.get("/v1/charges").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "the charge happened");
    let (status, replayed, body) =
        status_and_body(sim.post("/v1/charges", "k", &VISA_500).await).await;
    assert_eq!((status, replayed, body), (500, true, first), "the 500, not the charge");
    let stats = sim.stats().await;
    assert_eq!(
        (stats["charges_created"].as_u64(), stats["faults_injected"].as_u64()),
        (Some(1), Some(1))
    );
}

#[tokio::test]
async fn a_500_after_processing_touches_only_requests_that_execute() {
    let sim = start(FaultConfig::default()).await;
    let made = charge_with(&sim, "c1", &[("payment_id", "pay_1")], true).await;
    sim.set_faults(json!({"error_after_processing_rate": 1.0})).await;
    let (status, replayed, body) =
        status_and_body(sim.post("/v1/charges", "c1", &charge_form()).await).await;
    assert_eq!((status, replayed, body), (200, true, made), "a replay is answered as usual");
    let refused = sim.post("/v1/charges", "fresh", &[("currency", "usd")]).await;
    assert_eq!(refused.status(), 400, "a refusal on the parameters is answered as usual");
    let read = sim.http.get(format!("{}/v1/charges", sim.url)).bearer_auth("k").send().await;
    assert_eq!(read.unwrap().status(), 200, "a read acts on nothing and is answered as usual");
    let search = sim
        .http
        .get(format!("{}/v1/charges/search", sim.url))
        .query(&[("query", "metadata['payment_id']:'pay_1'")])
        .bearer_auth("k")
        .send()
        .await;
    assert_eq!(search.unwrap().status(), 200, "so is a search: reconciliation relies on it");
}

fn charge_form() -> Vec<(&'static str, &'static str)> {
    vec![
        ("amount", "1000"),
        ("currency", "usd"),
        ("source", "pm_card_visa"),
        ("metadata[payment_id]", "pay_1"),
    ]
}

#[tokio::test]
async fn lenient_mode_keeps_only_successes_and_declines() {
    let lenient = FaultConfig { idempotency: Idempotency::Lenient, ..FaultConfig::default() };
    let sim = start(lenient).await;
    let charge = charge_with(&sim, "c1", &[("payment_id", "pay_1")], false).await;
    let replay = sim.post("/v1/charges", "c1", &charge_form_uncaptured()).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true", "a 2xx is kept");
    let declined = [("amount", "500"), ("currency", "usd"), ("source", "pm_card_chargeDeclined")];
    sim.post("/v1/charges", "d", &declined).await;
    let decline = sim.post("/v1/charges", "d", &declined).await;
    assert_eq!(decline.status(), 402);
    assert_eq!(decline.headers()["idempotent-replayed"], "true", "a 402 is kept");

    let path = format!("/v1/charges/{}/capture", charge["id"].as_str().unwrap());
    sim.post(&path, "cap", &[("amount", "2000")]).await;
    let again = sim.post(&path, "cap", &[("amount", "2000")]).await;
    assert_eq!(again.status(), 400);
    assert!(again.headers().get("idempotent-replayed").is_none(), "an operation's 400 is not kept");

    sim.set_faults(json!({"idempotency": "lenient", "error_after_processing_rate": 1.0})).await;
    assert_eq!(sim.post("/v1/charges", "k", &VISA_500).await.status(), 500);
    sim.set_faults(json!({"idempotency": "lenient"})).await;
    let retry = sim.post("/v1/charges", "k", &VISA_500).await;
    assert_eq!(retry.status(), 200);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        sim.stats().await["charges_created"],
        4,
        "c1, the decline, and two for key k: the 500's charge was forgotten"
    );
    let faults: Value = sim.get("/_sim/faults").await;
    assert_eq!(faults["idempotency"], "lenient");
}

fn charge_form_uncaptured() -> Vec<(&'static str, &'static str)> {
    let mut form = charge_form();
    form.push(("capture", "false"));
    form
}

#[tokio::test]
async fn a_key_is_forgotten_once_its_lifetime_is_over() {
    let (sim, clock) =
        start_with_clock(FaultConfig { key_ttl_s: 2, ..FaultConfig::default() }).await;
    let first = status_and_body(sim.post("/v1/charges", "k", &VISA_500).await).await;
    clock.advance(Duration::from_millis(1999));
    let within = status_and_body(sim.post("/v1/charges", "k", &VISA_500).await).await;
    assert_eq!(within, (200, true, first.2.clone()), "still remembered");
    clock.advance(Duration::from_millis(1));
    let after = status_and_body(sim.post("/v1/charges", "k", &VISA_500).await).await;
    assert_eq!((after.0, after.1), (200, false));
    assert_ne!(after.2["id"], first.2["id"], "a new charge");
    let other = [("amount", "7"), ("currency", "usd"), ("source", "pm_card_visa")];
    let reused = sim.post("/v1/charges", "k", &other).await;
    assert_eq!(reused.status(), 400, "the new record holds the key again");
    let stats = sim.stats().await;
    assert_eq!(
        (stats["keys_expired"].as_u64(), stats["charges_created"].as_u64()),
        (Some(1), Some(2))
    );
}

#[tokio::test]
async fn search_finds_charges_by_metadata_newest_first_page_by_page() {
    let sim = start(FaultConfig::default()).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let pay = format!("pay_{n}");
        let made = charge_with(&sim, &pay, &[("payment_id", &pay), ("order", "o1")], true).await;
        ids.push(made["id"].as_str().unwrap().to_owned());
    }
    charge_with(&sim, "other", &[("payment_id", "pay_x"), ("order", "o2")], true).await;

    let one =
        sim.get("/v1/charges/search?query=metadata%5B%27payment_id%27%5D%3A%27pay_1%27").await;
    assert_eq!(one["object"], "search_result");
    assert_eq!(one["url"], "/v1/charges/search");
    assert_eq!((one["has_more"].as_bool(), one["next_page"].is_null()), (Some(false), true));
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    assert_eq!(one["data"][0]["id"], ids[1].as_str());

    let mut seen = Vec::new();
    let mut page: Option<String> = None;
    for _ in 0..3 {
        let mut url = reqwest::Url::parse(&format!("{}/v1/charges/search", sim.url)).unwrap();
        url.query_pairs_mut()
            .append_pair("query", "metadata['order']:'o1'")
            .append_pair("limit", "1");
        if let Some(page) = &page {
            url.query_pairs_mut().append_pair("page", page);
        }
        let answer: Value = sim
            .http
            .get(url)
            .bearer_auth("sk_test_sim")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        seen.push(answer["data"][0]["id"].as_str().unwrap().to_owned());
        page = answer["next_page"].as_str().map(str::to_owned);
        assert_eq!(answer["has_more"], page.is_some());
    }
    assert_eq!(seen, [ids[2].clone(), ids[1].clone(), ids[0].clone()], "newest first");
    assert!(page.is_none(), "the last page has no next");

    let both = sim
        .get("/v1/charges/search?query=metadata%5B%27order%27%5D%3A%27o1%27%20AND%20metadata%5B%27payment_id%27%5D%3A%27pay_2%27")
        .await;
    assert_eq!(both["data"].as_array().unwrap().len(), 1);
    assert_eq!(both["data"][0]["id"], ids[2].as_str());
    let none = sim.get("/v1/charges/search?query=metadata%5B%27order%27%5D%3A%27o3%27").await;
    assert_eq!(none["data"], json!([]));
    assert_eq!(sim.stats().await["searches"], 6);
}

#[tokio::test]
async fn a_query_the_stand_in_cannot_read_is_a_400_with_a_message() {
    let sim = start(FaultConfig::default()).await;
    for query in ["amount%3E100", "status%3A%27succeeded%27", ""] {
        let response = sim
            .http
            .get(format!("{}/v1/charges/search?query={query}", sim.url))
            .bearer_auth("sk_test_sim")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    }
    let missing = sim.http.get(format!("{}/v1/charges/search", sim.url)).bearer_auth("k").send();
    assert_eq!(missing.await.unwrap().status(), 400);
}

#[tokio::test]
async fn search_does_not_see_a_charge_until_the_lag_has_passed() {
    let (sim, clock) =
        start_with_clock(FaultConfig { search_lag_ms: 1000, ..FaultConfig::default() }).await;
    let made = charge_with(&sim, "k", &[("payment_id", "pay_1")], true).await;
    let search = "/v1/charges/search?query=metadata%5B%27payment_id%27%5D%3A%27pay_1%27";
    assert_eq!(sim.get(search).await["data"], json!([]), "just written");
    assert_eq!(
        sim.get(&format!("/v1/charges/{}", made["id"].as_str().unwrap())).await,
        made,
        "a retrieve sees it at once"
    );
    clock.advance(Duration::from_millis(999));
    assert_eq!(sim.get(search).await["data"], json!([]));
    clock.advance(Duration::from_millis(1));
    assert_eq!(sim.get(search).await["data"], json!([made]));
}

#[tokio::test]
async fn a_charges_refunds_are_listed_by_charge_newest_first() {
    let sim = start(FaultConfig::default()).await;
    let a = charge_with(&sim, "a", &[("payment_id", "pay_a")], true).await;
    let b = charge_with(&sim, "b", &[("payment_id", "pay_b")], true).await;
    let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    let mut refunds_of_a = Vec::new();
    for (n, charge) in [a, b, a, a].into_iter().enumerate() {
        let key = format!("r{n}");
        let refund: Value = sim
            .post(
                "/v1/refunds",
                &key,
                &[("charge", charge), ("amount", "100"), ("metadata[refund_id]", &key)],
            )
            .await
            .json()
            .await
            .unwrap();
        if charge == a {
            refunds_of_a.push(refund["id"].as_str().unwrap().to_owned());
        }
    }
    let page = sim.get(&format!("/v1/refunds?charge={a}&limit=2")).await;
    assert_eq!(
        (page["object"].as_str(), page["url"].as_str()),
        (Some("list"), Some("/v1/refunds"))
    );
    assert_eq!(page["has_more"], true);
    let first: Vec<&str> =
        page["data"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(first, [refunds_of_a[2].as_str(), refunds_of_a[1].as_str()]);
    assert_eq!(page["data"][0]["metadata"]["refund_id"], "r3");
    let rest =
        sim.get(&format!("/v1/refunds?charge={a}&limit=2&starting_after={}", first[1])).await;
    assert_eq!(rest["has_more"], false);
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["data"][0]["id"], refunds_of_a[0].as_str());
    let of_b = sim.get(&format!("/v1/refunds?charge={b}")).await;
    assert_eq!(of_b["data"].as_array().unwrap().len(), 1);
    assert_eq!(sim.get("/v1/refunds").await["data"].as_array().unwrap().len(), 4);
    let unknown = sim.get("/v1/refunds?charge=ch_nope").await;
    assert_eq!(unknown["error"]["code"], "resource_missing");
}

#[tokio::test]
async fn the_500_after_processing_fault_is_drawn_the_same_way_for_the_same_seed() {
    let faults = json!({"seed": 11, "error_after_processing_rate": 0.4, "error_rate": 0.2});
    let mut runs = Vec::new();
    for _ in 0..2 {
        let sim = start(FaultConfig::default()).await;
        sim.set_faults(faults.clone()).await;
        let mut statuses = Vec::new();
        for n in 0..30 {
            statuses
                .push(sim.post("/v1/charges", &format!("k{n}"), &VISA_500).await.status().as_u16());
        }
        let created = sim.stats().await["charges_created"].as_u64().unwrap();
        runs.push((statuses, created));
    }
    assert_eq!(runs[0], runs[1]);
    let (statuses, created) = &runs[0];
    let answered_500 = statuses.iter().filter(|&&s| s == 500).count();
    let executed = statuses.len() - answered_500;
    assert!(executed > 0 && answered_500 > 0, "{statuses:?}");
    assert!(
        *created > u64::try_from(executed).unwrap(),
        "some 500s were answered after the charge was made: {created} charges, {statuses:?}"
    );
}

#[tokio::test]
async fn every_answer_names_its_request() {
    let sim = start(FaultConfig::default()).await;
    let first = sim.post("/v1/charges", "k", &VISA_500).await;
    let second = sim.post("/v1/charges", "k", &VISA_500).await;
    let id = |r: &reqwest::Response| r.headers()["request-id"].to_str().unwrap().to_owned();
    assert!(id(&first).starts_with("req_"));
    assert_ne!(id(&first), id(&second));
}

#[tokio::test]
async fn the_fidelity_settings_are_validated_and_read_back() {
    let sim = start(FaultConfig::default()).await;
    let defaults: Value = sim.get("/_sim/faults").await;
    assert_eq!(
        (&defaults["idempotency"], &defaults["key_ttl_s"], &defaults["search_lag_ms"]),
        (&json!("stripe"), &json!(86400), &json!(0))
    );
    assert_eq!(defaults["error_after_processing_rate"], 0.0);
    for refused in [
        json!({"idempotency": "sloppy"}),
        json!({"key_ttl_s": 0}),
        json!({"search_lag_ms": 600_001}),
        json!({"error_after_processing_rate": 1.5}),
    ] {
        assert_eq!(sim.set_faults(refused.clone()).await.status(), 400, "{refused}");
    }
    let set = json!({"idempotency": "lenient", "key_ttl_s": 60, "search_lag_ms": 250});
    let applied: Value = sim.set_faults(set).await.json().await.unwrap();
    assert_eq!(
        (&applied["idempotency"], &applied["key_ttl_s"], &applied["search_lag_ms"]),
        (&json!("lenient"), &json!(60), &json!(250))
    );
}

#[tokio::test]
async fn a_key_longer_than_stripe_keeps_is_refused_before_anything_happens() {
    let sim = start(FaultConfig::default()).await;
    let longest = "k".repeat(255);
    assert_eq!(sim.post("/v1/charges", &longest, &VISA_500).await.status(), 200);
    let too_long = sim.post("/v1/charges", &"k".repeat(256), &VISA_500).await;
    assert_eq!(too_long.status(), 400);
    assert_eq!(too_long.json::<Value>().await.unwrap()["error"]["type"], "invalid_request_error");
    assert_eq!(sim.stats().await["charges_created"], 1);
}
