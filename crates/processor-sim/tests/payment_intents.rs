//! The stand-in's PaymentIntents, through plain HTTP: create and confirm with each family of test
//! cards, manual capture (whole and partial), the 402 of a decline, 3-D Secure completed, failed
//! and expired, cancel from each state, refunds by intent, list, search, Stripe's idempotency
//! rules on the new routes, and the webhooks each change raises.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use processor_sim::{FaultConfig, ManualClock, Simulator, WebhookTarget};
use serde_json::{Value, json};

struct Sim {
    url: String,
    http: reqwest::Client,
}

async fn start(faults: FaultConfig) -> Sim {
    start_with_clock(faults).await.0
}

/// Starts the stand-in on a clock the test moves.
async fn start_with_clock(faults: FaultConfig) -> (Sim, ManualClock) {
    let clock = ManualClock::new();
    let simulator =
        Simulator::build_with_clock("127.0.0.1:0", faults, clock.clone()).await.unwrap();
    let url = format!("http://127.0.0.1:{}", simulator.port());
    tokio::spawn(simulator.run_until(std::future::pending()));
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build();
    (Sim { url, http: http.unwrap() }, clock)
}

/// An answer: its status, whether it was replayed, its body.
type Answered = (u16, bool, Value);

impl Sim {
    async fn post(&self, path: &str, key: &str, form: &[(&str, &str)]) -> Answered {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth("sk_test_sim")
            .header("idempotency-key", key)
            .form(form)
            .send()
            .await
            .unwrap();
        let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        (response.status().as_u16(), replayed, response.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> Value {
        let request = self.http.get(format!("{}{path}", self.url)).bearer_auth("sk_test_sim");
        request.send().await.unwrap().json().await.unwrap()
    }

    async fn stats(&self) -> Value {
        self.get("/_sim/stats").await
    }

    async fn authenticate(&self, id: &str, outcome: &str) -> (u16, Value) {
        let url = format!("{}/_sim/payment_intents/{id}/authenticate", self.url);
        let response =
            self.http.post(url).json(&json!({ "outcome": outcome })).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    /// Creates and confirms an intent of 1000 with `card` (card-only, so no return_url is
    /// needed), tagged `metadata[payment_id]`; `extra` adds parameters.
    async fn pay(&self, key: &str, card: &str, extra: &[(&str, &str)]) -> Answered {
        let mut form = vec![
            ("amount", "1000"),
            ("currency", "usd"),
            ("payment_method", card),
            ("confirm", "true"),
            ("payment_method_types[]", "card"),
            ("metadata[payment_id]", key),
        ];
        form.extend_from_slice(extra);
        self.post("/v1/payment_intents", key, &form).await
    }
}

fn id(object: &Value) -> String {
    object["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_confirmed_intent_with_a_good_card_succeeds_with_a_charge_under_it() {
    let sim = start(FaultConfig::default()).await;
    let (status, replayed, intent) = sim.pay("pay_1", "pm_card_visa", &[]).await;
    assert_eq!((status, replayed), (200, false), "{intent}");
    let pi = id(&intent);
    assert!(pi.starts_with("pi_"));
    assert!(intent["client_secret"].as_str().unwrap().starts_with(&format!("{pi}_secret_")));
    let charge_id = intent["latest_charge"].as_str().unwrap();
    let unix_now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    assert!(intent["created"].as_u64().unwrap().abs_diff(unix_now.as_secs()) < 60);
    for (field, expected) in [
        ("object", json!("payment_intent")),
        ("status", json!("succeeded")),
        ("amount", json!(1000)),
        ("amount_received", json!(1000)),
        ("amount_capturable", json!(0)),
        ("capture_method", json!("automatic")),
        ("confirmation_method", json!("automatic")),
        ("currency", json!("usd")),
        ("livemode", json!(false)),
        ("metadata", json!({"payment_id": "pay_1"})),
        ("next_action", Value::Null),
        ("last_payment_error", Value::Null),
        ("payment_method", json!("pm_card_visa")),
        ("payment_method_types", json!(["card"])),
        ("automatic_payment_methods", Value::Null),
        ("canceled_at", Value::Null),
        ("cancellation_reason", Value::Null),
    ] {
        assert_eq!(intent[field], expected, "{field}");
    }
    let charge = sim.get(&format!("/v1/charges/{charge_id}")).await;
    assert_eq!(
        (&charge["payment_intent"], &charge["metadata"], &charge["captured"], &charge["amount"]),
        (&json!(pi), &json!({"payment_id": "pay_1"}), &json!(true), &json!(1000))
    );
    assert_eq!(sim.get("/v1/charges").await["data"], json!([charge]));
    let found = sim.get("/v1/charges/search?query=metadata%5B%27payment_id%27%5D%3A%27pay_1%27");
    assert_eq!(found.await["data"], json!([charge]), "charge search sees it as any charge");
    assert_eq!(sim.get(&format!("/v1/payment_intents/{pi}")).await, intent);
    let stats = sim.stats().await;
    assert_eq!(
        (stats["payment_intents_created"].as_u64(), stats["charges_created"].as_u64()),
        (Some(1), Some(1))
    );
}

#[tokio::test]
async fn an_intent_waits_for_a_payment_method_and_a_confirmation() {
    let sim = start(FaultConfig::default()).await;
    let bare = [("amount", "700"), ("currency", "eur"), ("payment_method_types[0]", "card")];
    let (_, _, waiting) = sim.post("/v1/payment_intents", "a", &bare).await;
    assert_eq!(
        (&waiting["status"], &waiting["payment_method"]),
        (&json!("requires_payment_method"), &Value::Null)
    );
    let confirm = format!("/v1/payment_intents/{}/confirm", id(&waiting));
    let (status, _, missing) = sim.post(&confirm, "c0", &[]).await;
    assert_eq!(status, 400);
    assert_eq!(missing["error"]["code"], "payment_intent_unexpected_state");
    assert_eq!(missing["error"]["payment_intent"]["id"], waiting["id"]);
    let (status, _, paid) =
        sim.post(&confirm, "c1", &[("payment_method", "pm_card_mastercard")]).await;
    assert_eq!(
        (status, &paid["status"], &paid["amount_received"]),
        (200, &json!("succeeded"), &json!(700))
    );

    let mut with_card = bare.to_vec();
    with_card.push(("payment_method", "pm_card_visa"));
    let (_, _, ready) = sim.post("/v1/payment_intents", "b", &with_card).await;
    assert_eq!(ready["status"], "requires_confirmation");
    assert_eq!(sim.stats().await["charges_created"], 1, "no charge before confirming");
    let confirm = format!("/v1/payment_intents/{}/confirm", id(&ready));
    let (_, _, paid) = sim.post(&confirm, "c2", &[]).await;
    assert_eq!(paid["status"], "succeeded");
    let (status, _, again) = sim.post(&confirm, "c3", &[]).await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (400, Some("payment_intent_unexpected_state"))
    );
    assert_eq!(again["error"]["payment_intent"]["status"], "succeeded");

    let (status, _, unknown) = sim.post("/v1/payment_intents/pi_nope/confirm", "c4", &[]).await;
    assert_eq!(
        (status, &unknown["error"]["code"], &unknown["error"]["param"]),
        (404, &json!("resource_missing"), &json!("intent"))
    );
    let unknown_card = [("amount", "1"), ("currency", "usd"), ("payment_method", "pm_card_nope")];
    let (status, _, refused) = sim.post("/v1/payment_intents", "d", &unknown_card).await;
    assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("payment_method")));
    assert_eq!(sim.stats().await["payment_intents_created"], 2, "the unknown card made none");
}

#[tokio::test]
async fn automatic_payment_methods_need_a_return_url_unless_redirects_are_off() {
    let sim = start(FaultConfig::default()).await;
    let form = [
        ("amount", "500"),
        ("currency", "usd"),
        ("payment_method", "pm_card_visa"),
        ("confirm", "true"),
    ];
    let (status, _, refused) = sim.post("/v1/payment_intents", "k", &form).await;
    assert_eq!((status, refused["error"]["param"].as_str()), (400, Some("return_url")));
    let mut with_url = form.to_vec();
    with_url.push(("return_url", "https://shop.example/back"));
    let (status, replayed, paid) = sim.post("/v1/payment_intents", "k", &with_url).await;
    assert_eq!((status, replayed), (200, false), "a refusal on the parameters keeps nothing");
    assert_eq!(
        paid["automatic_payment_methods"],
        json!({"enabled": true, "allow_redirects": "always"})
    );
    let mut never = form.to_vec();
    never.push(("automatic_payment_methods[enabled]", "true"));
    never.push(("automatic_payment_methods[allow_redirects]", "never"));
    let (status, _, paid) = sim.post("/v1/payment_intents", "n", &never).await;
    assert_eq!((status, &paid["status"]), (200, &json!("succeeded")));
    assert_eq!(paid["automatic_payment_methods"]["allow_redirects"], "never");
}

#[tokio::test]
async fn a_manual_capture_takes_all_or_part_and_releases_the_rest() {
    let sim = start(FaultConfig::default()).await;
    let manual = [("capture_method", "manual")];
    let (_, _, held) = sim.pay("pay_full", "pm_card_visa", &manual).await;
    assert_eq!(
        (&held["status"], &held["amount_capturable"], &held["amount_received"]),
        (&json!("requires_capture"), &json!(1000), &json!(0))
    );
    let charge = sim.get(&format!("/v1/charges/{}", held["latest_charge"].as_str().unwrap())).await;
    assert_eq!((&charge["captured"], &charge["paid"]), (&json!(false), &json!(true)));
    let capture = format!("/v1/payment_intents/{}/capture", id(&held));
    let (status, _, captured) = sim.post(&capture, "cap1", &[]).await;
    assert_eq!(
        (status, &captured["status"], &captured["amount_received"], &captured["amount_capturable"]),
        (200, &json!("succeeded"), &json!(1000), &json!(0))
    );
    let (status, _, twice) = sim.post(&capture, "cap2", &[]).await;
    assert_eq!(
        (status, twice["error"]["code"].as_str()),
        (400, Some("payment_intent_unexpected_state"))
    );
    assert_eq!(twice["error"]["payment_intent"], captured);

    let (_, _, held) = sim.pay("pay_part", "pm_card_visa", &manual).await;
    let capture = format!("/v1/payment_intents/{}/capture", id(&held));
    let (status, _, too_much) = sim.post(&capture, "cap3", &[("amount_to_capture", "1001")]).await;
    assert_eq!((status, too_much["error"]["code"].as_str()), (400, Some("amount_too_large")));
    let (status, _, part) = sim.post(&capture, "cap4", &[("amount_to_capture", "600")]).await;
    assert_eq!(
        (status, &part["status"], &part["amount_received"]),
        (200, &json!("succeeded"), &json!(600))
    );
    let charge = sim.get(&format!("/v1/charges/{}", part["latest_charge"].as_str().unwrap())).await;
    assert_eq!(
        (&charge["amount_captured"], &charge["amount_refunded"]),
        (&json!(600), &json!(400))
    );
    assert_eq!(sim.stats().await["captures"], 2);

    // The intent's charge captured through the Charges API moves the intent too.
    let (_, _, held) = sim.pay("pay_via_charge", "pm_card_visa", &manual).await;
    let via = format!("/v1/charges/{}/capture", held["latest_charge"].as_str().unwrap());
    let (status, _, charge) = sim.post(&via, "cap5", &[]).await;
    assert_eq!((status, &charge["captured"]), (200, &json!(true)));
    let now = sim.get(&format!("/v1/payment_intents/{}", id(&held))).await;
    assert_eq!((&now["status"], &now["amount_received"]), (&json!("succeeded"), &json!(1000)));
}

#[tokio::test]
async fn a_decline_answers_stripes_402_with_the_intent_inside() {
    let sim = start(FaultConfig::default()).await;
    let cards = [
        ("pm_card_chargeDeclined", "card_declined", "generic_decline"),
        ("pm_card_chargeDeclinedInsufficientFunds", "card_declined", "insufficient_funds"),
        ("pm_card_chargeDeclinedLostCard", "card_declined", "lost_card"),
        ("pm_card_chargeDeclinedStolenCard", "card_declined", "stolen_card"),
        ("pm_card_chargeDeclinedExpiredCard", "expired_card", "expired_card"),
        ("pm_card_chargeDeclinedIncorrectCvc", "incorrect_cvc", "incorrect_cvc"),
        ("pm_card_chargeDeclinedProcessingError", "processing_error", "processing_error"),
    ];
    for (n, (card, code, decline_code)) in cards.into_iter().enumerate() {
        let (status, _, body) = sim.pay(&format!("pay_{n}"), card, &[]).await;
        assert_eq!(status, 402, "{card}");
        let error = &body["error"];
        assert_eq!(
            (&error["type"], &error["code"], &error["decline_code"]),
            (&json!("card_error"), &json!(code), &json!(decline_code)),
            "{card}"
        );
        let charge_id = error["charge"].as_str().unwrap();
        let intent = &error["payment_intent"];
        assert_eq!(
            (&intent["status"], &intent["latest_charge"], &intent["payment_method"]),
            (&json!("requires_payment_method"), &json!(charge_id), &Value::Null),
            "{card}"
        );
        let mut last_error = error.clone();
        last_error.as_object_mut().unwrap().remove("payment_intent");
        assert_eq!(intent["last_payment_error"], last_error, "{card}: the error is the intent's");
        assert_eq!(
            error["payment_method"],
            json!({"id": card, "object": "payment_method", "type": "card"})
        );
        let charge = sim.get(&format!("/v1/charges/{charge_id}")).await;
        assert_eq!(
            (&charge["status"], &charge["failure_code"], &charge["outcome"]["reason"]),
            (&json!("failed"), &json!(code), &json!(decline_code))
        );
        assert_eq!(charge["payment_intent"], intent["id"]);
    }
    let (_, _, body) = sim.pay("pay_x", "pm_card_chargeDeclined", &[]).await;
    assert_eq!(body["error"]["message"], "Your card was declined.");
    // The declined intent can be confirmed again with another card.
    let confirm = format!(
        "/v1/payment_intents/{}/confirm",
        body["error"]["payment_intent"]["id"].as_str().unwrap()
    );
    let (status, _, paid) =
        sim.post(&confirm, "retry", &[("payment_method", "pm_card_visa")]).await;
    assert_eq!(
        (status, &paid["status"], &paid["last_payment_error"]),
        (200, &json!("succeeded"), &Value::Null)
    );
    assert_eq!(sim.stats().await["charges_created"], 9);
}

#[tokio::test]
async fn an_authentication_completed_at_the_test_page_makes_the_charge() {
    let sim = start(FaultConfig::default()).await;
    let back = [("return_url", "https://shop.example/back")];
    for (n, card) in [
        "pm_card_authenticationRequired",
        "pm_card_authenticationRequiredOnSetup",
        "pm_card_threeDSecure2Required",
        "pm_card_threeDSecureRequired",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("pay_{n}");
        let (status, _, waiting) = sim.pay(&key, card, &back).await;
        assert_eq!(
            (status, &waiting["status"], &waiting["latest_charge"]),
            (200, &json!("requires_action"), &Value::Null),
            "{card}"
        );
        let pi = id(&waiting);
        assert_eq!(
            waiting["next_action"],
            json!({"type": "redirect_to_url", "redirect_to_url": {
                "url": format!("{}/_sim/authenticate/{pi}", sim.url),
                "return_url": "https://shop.example/back"}}),
            "{card}"
        );
        let (status, done) = sim.authenticate(&pi, "complete").await;
        assert_eq!(
            (status, &done["status"], &done["amount_received"], &done["next_action"]),
            (200, &json!("succeeded"), &json!(1000), &Value::Null),
            "{card}"
        );
        let charge =
            sim.get(&format!("/v1/charges/{}", done["latest_charge"].as_str().unwrap())).await;
        assert_eq!((&charge["paid"], &charge["payment_intent"]), (&json!(true), &json!(pi)));
        // The create's key keeps what it answered; a read shows the intent as it is now.
        let (_, replayed, again) = sim.pay(&key, card, &back).await;
        assert_eq!((replayed, again), (true, waiting));
        assert_eq!(sim.get(&format!("/v1/payment_intents/{pi}")).await, done);
        let (status, late) = sim.authenticate(&pi, "fail").await;
        assert_eq!(
            (status, &late["error"]["code"]),
            (400, &json!("payment_intent_unexpected_state"))
        );
    }
    assert_eq!(sim.stats().await["charges_created"], 4);

    let (_, _, held) = sim
        .pay("pay_manual", "pm_card_threeDSecure2Required", &[("capture_method", "manual")])
        .await;
    assert_eq!(held["next_action"]["type"], "use_stripe_sdk", "no return_url: the SDK's way");
    assert!(
        held["next_action"]["use_stripe_sdk"]["stripe_js"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/_sim/authenticate/{}", id(&held)))
    );
    let (_, done) = sim.authenticate(&id(&held), "complete").await;
    assert_eq!(
        (&done["status"], &done["amount_capturable"]),
        (&json!("requires_capture"), &json!(1000))
    );
    let (status, unknown) = sim.authenticate("pi_nope", "complete").await;
    assert_eq!((status, &unknown["error"]["code"]), (404, &json!("resource_missing")));
    let bad = sim
        .http
        .post(format!("{}/_sim/payment_intents/{}/authenticate", sim.url, id(&held)))
        .json(&json!({"outcome": "maybe"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn a_failed_authentication_leaves_the_intent_without_a_charge() {
    let sim = start(FaultConfig::default()).await;
    let (_, _, waiting) = sim.pay("pay_1", "pm_card_authenticationRequired", &[]).await;
    let (status, failed) = sim.authenticate(&id(&waiting), "fail").await;
    assert_eq!(status, 200);
    assert_eq!(
        (
            &failed["status"],
            &failed["payment_method"],
            &failed["latest_charge"],
            &failed["next_action"]
        ),
        (&json!("requires_payment_method"), &Value::Null, &Value::Null, &Value::Null)
    );
    let error = &failed["last_payment_error"];
    assert_eq!(
        (&error["type"], &error["code"]),
        (&json!("invalid_request_error"), &json!("payment_intent_authentication_failure"))
    );
    assert_eq!(error["payment_method"]["id"], "pm_card_authenticationRequired");
    assert_eq!(sim.stats().await["charges_created"], 0);
}

#[tokio::test]
async fn an_authentication_nobody_completes_fails_when_its_time_is_up() {
    let faults = FaultConfig { authentication_ttl_s: 60, ..FaultConfig::default() };
    let (sim, clock) = start_with_clock(faults).await;
    let (_, _, waiting) = sim.pay("pay_1", "pm_card_authenticationRequired", &[]).await;
    let path = format!("/v1/payment_intents/{}", id(&waiting));
    clock.advance(Duration::from_millis(59_999));
    assert_eq!(sim.get(&path).await["status"], "requires_action");
    clock.advance(Duration::from_millis(1));
    let expired = sim.get(&path).await;
    assert_eq!(expired["status"], "requires_payment_method");
    assert_eq!(expired["last_payment_error"]["code"], "payment_intent_authentication_failure");
    assert_eq!(
        sim.get("/v1/payment_intents").await["data"],
        json!([expired]),
        "a list sees the same"
    );
    let (status, _) = sim.authenticate(&id(&waiting), "complete").await;
    assert_eq!(status, 400, "too late");
    let stats = sim.stats().await;
    assert_eq!(
        (stats["authentications_expired"].as_u64(), stats["charges_created"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!((sim.get("/_sim/faults").await)["authentication_ttl_s"], 60);
}

#[tokio::test]
async fn an_intent_is_canceled_from_every_state_but_succeeded_and_canceled() {
    let sim = start(FaultConfig::default()).await;
    let bare = [("amount", "1000"), ("currency", "usd"), ("payment_method_types[]", "card")];
    let (_, _, no_method) = sim.post("/v1/payment_intents", "a", &bare).await;
    let mut with_card = bare.to_vec();
    with_card.push(("payment_method", "pm_card_visa"));
    let (_, _, unconfirmed) = sim.post("/v1/payment_intents", "b", &with_card).await;
    let (_, _, waiting) = sim.pay("c", "pm_card_authenticationRequired", &[]).await;
    let (_, _, held) = sim.pay("d", "pm_card_visa", &[("capture_method", "manual")]).await;
    for (intent, from) in [
        (&no_method, "requires_payment_method"),
        (&unconfirmed, "requires_confirmation"),
        (&waiting, "requires_action"),
        (&held, "requires_capture"),
    ] {
        assert_eq!(intent["status"], from);
        let cancel = format!("/v1/payment_intents/{}/cancel", id(intent));
        let (status, _, canceled) = sim
            .post(&cancel, &format!("x{from}"), &[("cancellation_reason", "requested_by_customer")])
            .await;
        assert_eq!(
            (status, &canceled["status"], &canceled["cancellation_reason"]),
            (200, &json!("canceled"), &json!("requested_by_customer")),
            "{from}"
        );
        assert!(canceled["canceled_at"].as_u64().is_some());
        let (status, _, again) = sim.post(&cancel, &format!("y{from}"), &[]).await;
        assert_eq!(
            (status, &again["error"]["code"], &again["error"]["payment_intent"]),
            (400, &json!("payment_intent_unexpected_state"), &canceled)
        );
    }
    let released =
        sim.get(&format!("/v1/charges/{}", held["latest_charge"].as_str().unwrap())).await;
    assert_eq!(
        (&released["amount_refunded"], &released["refunded"], &released["captured"]),
        (&json!(1000), &json!(true), &json!(false))
    );
    let (status, _) = sim.authenticate(&id(&waiting), "complete").await;
    assert_eq!(status, 400, "a canceled intent cannot be authenticated");

    let (_, _, paid) = sim.pay("e", "pm_card_visa", &[]).await;
    let cancel = format!("/v1/payment_intents/{}/cancel", id(&paid));
    let (status, _, refused) = sim.post(&cancel, "z", &[]).await;
    assert_eq!((status, &refused["error"]["payment_intent"]["status"]), (400, &json!("succeeded")));
    let (status, _, bad_reason) = sim.post(&cancel, "w", &[("cancellation_reason", "bored")]).await;
    assert_eq!((status, bad_reason["error"]["param"].as_str()), (400, Some("cancellation_reason")));
    let stats = sim.stats().await;
    assert_eq!(
        (stats["payment_intents_canceled"].as_u64(), stats["refunds_created"].as_u64()),
        (Some(4), Some(1))
    );
}

#[tokio::test]
async fn refunds_by_payment_intent_refund_its_charge_and_are_listed_by_it() {
    let sim = start(FaultConfig::default()).await;
    let (_, _, paid) = sim.pay("pay_1", "pm_card_visa", &[]).await;
    let pi = id(&paid);
    let charge = paid["latest_charge"].as_str().unwrap();
    let mut made = Vec::new();
    for (n, amount) in ["300", "200"].into_iter().enumerate() {
        let key = format!("re_{n}");
        let (status, _, refund) = sim
            .post(
                "/v1/refunds",
                &key,
                &[("payment_intent", &pi), ("amount", amount), ("metadata[refund_id]", &key)],
            )
            .await;
        assert_eq!(status, 200, "{refund}");
        assert_eq!((&refund["charge"], &refund["payment_intent"]), (&json!(charge), &json!(pi)));
        made.push(id(&refund));
    }
    let (_, _, rest) = sim.post("/v1/refunds", "re_2", &[("payment_intent", &pi)]).await;
    assert_eq!(rest["amount"], 500);
    made.push(id(&rest));
    let listed = sim.get(&format!("/v1/refunds?payment_intent={pi}&limit=2")).await;
    assert_eq!(listed["has_more"], true);
    let ids: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [made[2].as_str(), made[1].as_str()]);
    let by_charge = sim.get(&format!("/v1/refunds?charge={charge}")).await;
    assert_eq!(by_charge["data"].as_array().unwrap().len(), 3);
    assert_eq!(sim.get(&format!("/v1/charges/{charge}")).await["refunded"], true);
    assert_eq!(sim.get(&format!("/v1/payment_intents/{pi}")).await["status"], "succeeded");

    let (_, _, held) = sim.pay("pay_2", "pm_card_visa", &[("capture_method", "manual")]).await;
    let (status, _, refused) =
        sim.post("/v1/refunds", "re_3", &[("payment_intent", &id(&held))]).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("charge_not_refundable")));
    let by_charge = [("charge", held["latest_charge"].as_str().unwrap())];
    let (status, _, refused) = sim.post("/v1/refunds", "re_4", &by_charge).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (400, Some("charge_not_refundable")),
        "cancel the intent instead"
    );
    let (_, _, declined) = sim.pay("pay_3", "pm_card_chargeDeclined", &[]).await;
    let declined_pi = declined["error"]["payment_intent"]["id"].as_str().unwrap();
    let (status, _, refused) =
        sim.post("/v1/refunds", "re_5", &[("payment_intent", declined_pi)]).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("charge_not_refundable")));
    assert_eq!(
        sim.get(&format!("/v1/refunds?payment_intent={declined_pi}")).await["data"],
        json!([])
    );
    let (status, _, unknown) =
        sim.post("/v1/refunds", "re_6", &[("payment_intent", "pi_nope")]).await;
    assert_eq!((status, unknown["error"]["param"].as_str()), (404, Some("payment_intent")));
    assert_eq!(
        sim.get("/v1/refunds?payment_intent=pi_nope").await["error"]["code"],
        "resource_missing"
    );
}

#[tokio::test]
async fn intents_are_listed_newest_first_a_page_at_a_time_either_way() {
    let sim = start(FaultConfig::default()).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(id(&sim.pay(&format!("pay_{n}"), "pm_card_visa", &[]).await.2));
    }
    let page_ids =
        |page: &Value| -> Vec<String> { page["data"].as_array().unwrap().iter().map(id).collect() };
    let first = sim.get("/v1/payment_intents?limit=2").await;
    assert_eq!(
        (&first["object"], &first["url"], &first["has_more"]),
        (&json!("list"), &json!("/v1/payment_intents"), &json!(true))
    );
    assert_eq!(page_ids(&first), [ids[4].clone(), ids[3].clone()]);
    let second = sim.get(&format!("/v1/payment_intents?limit=2&starting_after={}", ids[3])).await;
    assert_eq!(
        (page_ids(&second), &second["has_more"]),
        (vec![ids[2].clone(), ids[1].clone()], &json!(true))
    );
    let last = sim.get(&format!("/v1/payment_intents?limit=2&starting_after={}", ids[1])).await;
    assert_eq!((page_ids(&last), &last["has_more"]), (vec![ids[0].clone()], &json!(false)));
    let back = sim.get(&format!("/v1/payment_intents?limit=2&ending_before={}", ids[0])).await;
    assert_eq!(
        (page_ids(&back), &back["has_more"]),
        (vec![ids[2].clone(), ids[1].clone()], &json!(true))
    );
    let newest = sim.get(&format!("/v1/payment_intents?limit=2&ending_before={}", ids[2])).await;
    assert_eq!(
        (page_ids(&newest), &newest["has_more"]),
        (vec![ids[4].clone(), ids[3].clone()], &json!(false))
    );
    let unknown = sim.get("/v1/payment_intents?starting_after=pi_nope").await;
    assert_eq!(unknown["error"]["param"], "starting_after");
    let missing = sim.get("/v1/payment_intents/pi_nope").await;
    assert_eq!(
        (&missing["error"]["code"], &missing["error"]["param"]),
        (&json!("resource_missing"), &json!("intent"))
    );
}

#[tokio::test]
async fn search_finds_intents_by_metadata_once_the_lag_has_passed() {
    let faults = FaultConfig { search_lag_ms: 1000, ..FaultConfig::default() };
    let (sim, clock) = start_with_clock(faults).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let (_, _, made) =
            sim.pay(&format!("pay_{n}"), "pm_card_visa", &[("metadata[order]", "o1")]).await;
        ids.push(id(&made));
    }
    let one = "/v1/payment_intents/search?query=metadata%5B%27payment_id%27%5D%3A%27pay_1%27";
    assert_eq!(sim.get(one).await["data"], json!([]), "just written");
    clock.advance(Duration::from_millis(1000));
    let found = sim.get(one).await;
    assert_eq!(
        (&found["object"], &found["url"]),
        (&json!("search_result"), &json!("/v1/payment_intents/search"))
    );
    assert_eq!(found["data"], json!([sim.get(&format!("/v1/payment_intents/{}", ids[1])).await]));
    let page = sim
        .get("/v1/payment_intents/search?query=metadata%5B%27order%27%5D%3A%27o1%27&limit=2")
        .await;
    assert_eq!(page["has_more"], true);
    let next = page["next_page"].as_str().unwrap();
    let rest = sim.get(&format!("/v1/payment_intents/search?query=metadata%5B%27order%27%5D%3A%27o1%27&limit=2&page={next}")).await;
    let seen: Vec<String> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["data"].as_array().unwrap())
        .map(id)
        .collect();
    assert_eq!(seen, [ids[2].clone(), ids[1].clone(), ids[0].clone()]);
    assert_eq!((&rest["has_more"], &rest["next_page"]), (&json!(false), &Value::Null));
    let refused = sim.get("/v1/payment_intents/search?query=amount%3E1").await;
    assert_eq!(refused["error"]["param"], "query");
    let stats = sim.stats().await;
    assert_eq!(
        (stats["payment_intent_searches"].as_u64(), stats["searches"].as_u64()),
        (Some(5), Some(0))
    );
}

#[tokio::test]
async fn the_new_routes_keep_replay_and_refuse_a_key_reused_with_other_parameters() {
    let sim = start(FaultConfig::default()).await;
    let first = sim.pay("k1", "pm_card_visa", &[("capture_method", "manual")]).await;
    let again = sim.pay("k1", "pm_card_visa", &[("capture_method", "manual")]).await;
    assert_eq!(again, (200, true, first.2.clone()));
    let (status, replayed, mismatch) = sim.pay("k1", "pm_card_visa", &[]).await;
    assert_eq!(
        (status, replayed, &mismatch["error"]["type"]),
        (400, false, &json!("idempotency_error"))
    );
    let capture = format!("/v1/payment_intents/{}/capture", id(&first.2));
    let captured = sim.post(&capture, "cap", &[("amount_to_capture", "400")]).await;
    assert_eq!(
        sim.post(&capture, "cap", &[("amount_to_capture", "400")]).await,
        (200, true, captured.2.clone())
    );
    let (status, _, mismatch) = sim.post(&capture, "cap", &[("amount_to_capture", "500")]).await;
    assert_eq!((status, &mismatch["error"]["type"]), (400, &json!("idempotency_error")));
    let refused = sim.post(&capture, "cap2", &[]).await;
    assert_eq!(sim.post(&capture, "cap2", &[]).await, (400, true, refused.2), "a kept 400");
    let declined = sim.pay("k2", "pm_card_chargeDeclined", &[]).await;
    assert_eq!(
        sim.pay("k2", "pm_card_chargeDeclined", &[]).await,
        (402, true, declined.2),
        "a kept 402"
    );
    let stats = sim.stats().await;
    assert_eq!(
        (
            stats["payment_intents_created"].as_u64(),
            stats["charges_created"].as_u64(),
            stats["idempotency_errors"].as_u64()
        ),
        (Some(2), Some(2), Some(2))
    );
}

#[tokio::test]
async fn a_500_after_processing_on_a_create_is_kept_and_the_intent_exists() {
    let faults = FaultConfig { error_after_processing_rate: 1.0, ..FaultConfig::default() };
    let sim = start(faults).await;
    let (status, _, first) = sim.pay("k", "pm_card_visa", &[]).await;
    assert_eq!((status, &first["error"]["type"]), (500, &json!("api_error")));
    let set = sim.http.put(format!("{}/_sim/faults", sim.url)).json(&json!({})).send().await;
    assert_eq!(set.unwrap().status(), 200);
    assert_eq!(sim.pay("k", "pm_card_visa", &[]).await, (500, true, first));
    let listed = sim.get("/v1/payment_intents").await;
    assert_eq!(listed["data"][0]["status"], "succeeded", "the intent behind the 500 exists");
    assert_eq!(sim.stats().await["payment_intents_created"], 1);
}

#[tokio::test]
async fn the_test_page_shows_two_buttons_and_sends_the_customer_back() {
    let sim = start(FaultConfig::default()).await;
    let back = [("return_url", "https://shop.example/back?order=7")];
    let (_, _, waiting) = sim.pay("p", "pm_card_authenticationRequired", &back).await;
    let url = waiting["next_action"]["redirect_to_url"]["url"].as_str().unwrap();
    let page = sim.http.get(url).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("value=\"complete\"") && page.contains("value=\"fail\""), "{page}");
    let done = sim.http.post(url).form(&[("outcome", "complete")]).send().await.unwrap();
    assert_eq!(done.status(), 303);
    let pi = id(&waiting);
    let secret = waiting["client_secret"].as_str().unwrap();
    assert_eq!(
        done.headers()["location"].to_str().unwrap(),
        format!(
            "https://shop.example/back?order=7&payment_intent={pi}&payment_intent_client_secret={secret}&redirect_status=succeeded"
        )
    );
    let after = sim.http.get(url).send().await.unwrap().text().await.unwrap();
    assert!(!after.contains("<form") && after.contains("succeeded"), "{after}");
}

/// A webhook endpoint that keeps the type and object of every event it is sent.
async fn receiver() -> (String, Arc<Mutex<Vec<(String, Value)>>>) {
    let events: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let kept = events.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let event: Value = serde_json::from_slice(&body).unwrap();
                let kind = event["type"].as_str().unwrap().to_owned();
                kept.lock().unwrap().push((kind, event["data"]["object"].clone()));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, events)
}

/// Waits (5 s at most) until `count` events have come, and takes them.
async fn take_events(events: &Mutex<Vec<(String, Value)>>, count: usize) -> Vec<(String, Value)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if events.lock().unwrap().len() >= count || std::time::Instant::now() > deadline {
            return std::mem::take(&mut *events.lock().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn kinds(events: &[(String, Value)]) -> BTreeSet<&str> {
    events.iter().map(|(kind, _)| kind.as_str()).collect()
}

#[tokio::test]
async fn each_change_of_an_intent_raises_its_webhook_and_its_charges() {
    let faults = FaultConfig { authentication_ttl_s: 60, ..FaultConfig::default() };
    let clock = ManualClock::new();
    let simulator =
        Simulator::build_with_clock("127.0.0.1:0", faults, clock.clone()).await.unwrap();
    let (url, events) = receiver().await;
    simulator
        .set_webhook_target(Some(WebhookTarget { url, secret: "whsec_intents_test".into() }))
        .unwrap();
    let sim =
        Sim { url: format!("http://127.0.0.1:{}", simulator.port()), http: reqwest::Client::new() };
    tokio::spawn(simulator.run_until(std::future::pending()));

    let (_, _, paid) = sim.pay("a", "pm_card_visa", &[]).await;
    let got = take_events(&events, 2).await;
    assert_eq!(kinds(&got), BTreeSet::from(["charge.succeeded", "payment_intent.succeeded"]));
    let intent_event = got.iter().find(|(kind, _)| kind == "payment_intent.succeeded").unwrap();
    assert_eq!(intent_event.1, paid, "the event carries the intent as answered");

    let (_, _, held) = sim.pay("b", "pm_card_visa", &[("capture_method", "manual")]).await;
    assert_eq!(
        kinds(&take_events(&events, 2).await),
        BTreeSet::from(["charge.succeeded", "payment_intent.amount_capturable_updated"])
    );
    sim.post(
        &format!("/v1/payment_intents/{}/capture", id(&held)),
        "c",
        &[("amount_to_capture", "100")],
    )
    .await;
    assert_eq!(
        kinds(&take_events(&events, 2).await),
        BTreeSet::from(["charge.captured", "payment_intent.succeeded"])
    );

    sim.pay("d", "pm_card_chargeDeclined", &[]).await;
    assert_eq!(
        kinds(&take_events(&events, 2).await),
        BTreeSet::from(["charge.failed", "payment_intent.payment_failed"])
    );

    let (_, _, waiting) = sim.pay("e", "pm_card_authenticationRequired", &[]).await;
    assert_eq!(
        kinds(&take_events(&events, 1).await),
        BTreeSet::from(["payment_intent.requires_action"])
    );
    sim.authenticate(&id(&waiting), "complete").await;
    assert_eq!(
        kinds(&take_events(&events, 2).await),
        BTreeSet::from(["charge.succeeded", "payment_intent.succeeded"])
    );
    sim.post("/v1/refunds", "f", &[("payment_intent", &id(&waiting))]).await;
    assert_eq!(kinds(&take_events(&events, 1).await), BTreeSet::from(["charge.refunded"]));

    let (_, _, held) = sim.pay("g", "pm_card_visa", &[("capture_method", "manual")]).await;
    take_events(&events, 2).await;
    sim.post(&format!("/v1/payment_intents/{}/cancel", id(&held)), "h", &[]).await;
    assert_eq!(
        kinds(&take_events(&events, 2).await),
        BTreeSet::from(["charge.refunded", "payment_intent.canceled"])
    );

    let (_, _, waiting) = sim.pay("i", "pm_card_threeDSecure2Required", &[]).await;
    take_events(&events, 1).await;
    sim.authenticate(&id(&waiting), "fail").await;
    assert_eq!(
        kinds(&take_events(&events, 1).await),
        BTreeSet::from(["payment_intent.payment_failed"])
    );

    sim.pay("j", "pm_card_authenticationRequired", &[]).await;
    take_events(&events, 1).await;
    clock.advance(Duration::from_secs(60));
    sim.get("/v1/payment_intents").await;
    let expired = take_events(&events, 1).await;
    assert_eq!(kinds(&expired), BTreeSet::from(["payment_intent.payment_failed"]));
    assert_eq!(expired[0].1["last_payment_error"]["code"], "payment_intent_authentication_failure");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(events.lock().unwrap().is_empty(), "nothing more");
}
