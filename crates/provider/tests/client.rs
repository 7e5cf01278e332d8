//! The client against wiremock: the exact wire format, each error class, retries and timeouts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::time::{Duration, Instant};

use provider::{
    CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, PaymentIntentRequest, ProcessorClient,
    ProcessorConfig, ProcessorError, ReconcileCause, RefundRequest, TransientCause,
};
use serde_json::json;
use wiremock::matchers::{body_string_contains, header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

fn config(base_url: &str) -> ProcessorConfig {
    ProcessorConfig {
        base_url: base_url.to_owned(),
        api_key: "sk_test_processor".to_owned(),
        connect_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(500),
        max_retries: 2,
        backoff_base: Duration::from_millis(5),
        backoff_cap: Duration::from_millis(20),
        retry_after_cap: Duration::from_secs(2),
        search_lag: Duration::ZERO,
        stripe_version: None,
    }
}

fn client(server: &MockServer) -> ProcessorClient {
    ProcessorClient::new(config(&server.uri())).unwrap()
}

fn intent_request() -> PaymentIntentRequest {
    PaymentIntentRequest {
        payment_id: "pay_123".into(),
        amount: 500,
        currency: "usd".into(),
        payment_method: "pm_card_visa".into(),
        capture: false,
        description: Some("Two books & a pen".into()),
        metadata: Default::default(),
        return_url: "https://pay.example.com/return".into(),
    }
}

/// The create of `intent_request()` under the payment's first-generation key.
fn frozen_intent() -> FrozenRequest {
    intent_request().freeze(DownstreamKey::charge("pay_123"))
}

/// An authorized PaymentIntent, as Stripe answers a create with manual capture.
fn intent_json() -> serde_json::Value {
    json!({"id": "pi_1", "object": "payment_intent", "amount": 500, "amount_capturable": 500,
           "amount_received": 0, "currency": "usd", "status": "requires_capture",
           "capture_method": "manual", "latest_charge": "ch_1", "next_action": null,
           "last_payment_error": null, "metadata": {"payment_id": "pay_123"}})
}

fn form(request: &Request) -> Vec<(String, String)> {
    serde_urlencoded::from_bytes(&request.body).unwrap()
}

#[tokio::test]
async fn a_payment_intent_is_sent_as_stripe_expects() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/payment_intents"))
        .and(header("authorization", "Bearer sk_test_processor"))
        .and(header("idempotency-key", "pay_123/charge"))
        .and(header("content-type", "application/x-www-form-urlencoded"))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent_json()))
        .expect(1)
        .mount(&server)
        .await;
    let intent = client(&server).create_payment_intent(&frozen_intent()).await.unwrap();
    assert_eq!(intent.id, "pi_1");

    let received = &server.received_requests().await.unwrap()[0];
    let mut fields = form(received);
    fields.sort();
    assert_eq!(
        fields,
        vec![
            ("allowed_payment_method_types[0]".into(), "card".into()),
            ("amount".into(), "500".into()),
            ("capture_method".into(), "manual".into()),
            ("confirm".into(), "true".into()),
            ("currency".into(), "usd".into()),
            ("description".into(), "Two books & a pen".into()),
            ("metadata[payment_id]".into(), "pay_123".into()),
            ("payment_method".into(), "pm_card_visa".into()),
            ("return_url".into(), "https://pay.example.com/return".into()),
        ]
    );
}

#[tokio::test]
async fn refunds_and_captures_carry_their_keys_and_metadata() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/refunds"))
        .and(header("idempotency-key", "re_9/refund"))
        .and(body_string_contains("metadata%5Brefund_id%5D=re_9"))
        .and(body_string_contains("metadata%5Bpayment_id%5D=pay_123"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"id": "re_x", "charge": "ch_1", "payment_intent": "pi_1", "amount": 200,
                   "status": "succeeded"}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/payment_intents/pi_1/capture"))
        .and(header("idempotency-key", "pay_123/capture/k7"))
        .and(body_string_contains("amount_to_capture=300"))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent_json()))
        .expect(1)
        .mount(&server)
        .await;
    let client = client(&server);
    let refund = RefundRequest {
        charge_id: None,
        payment_intent: Some("pi_1".into()),
        payment_id: "pay_123".into(),
        refund_id: Some("re_9".into()),
        amount: Some(200),
        reason: Some("requested_by_customer".into()),
    };
    assert_eq!(
        client.create_refund(&refund.freeze(DownstreamKey::refund("re_9"))).await.unwrap().amount,
        200
    );
    client
        .capture_payment_intent(&FrozenRequest::capture_intent(
            "pi_1",
            Some(300),
            DownstreamKey::capture("pay_123", 7),
        ))
        .await
        .unwrap();
}

async fn error_for(status: u16, body: serde_json::Value) -> (ProcessorError, usize) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(status).set_body_json(body))
        .mount(&server)
        .await;
    let err = client(&server).create_payment_intent(&frozen_intent()).await.unwrap_err();
    (err, server.received_requests().await.unwrap().len())
}

#[tokio::test]
async fn a_decline_is_final_and_not_retried() {
    let (err, requests) = error_for(
        402,
        json!({"error": {"type": "card_error", "code": "card_declined",
               "decline_code": "insufficient_funds", "message": "Your card has insufficient funds.",
               "charge": "ch_failed",
               "payment_intent": {"id": "pi_failed", "object": "payment_intent", "amount": 500,
                                  "currency": "usd", "status": "requires_payment_method"}}}),
    )
    .await;
    assert_eq!(err.class(), ErrorClass::Final);
    assert_eq!(
        err,
        ProcessorError::Declined {
            decline_code: "insufficient_funds".into(),
            message: "Your card has insufficient funds.".into(),
            charge_id: Some("ch_failed".into()),
            payment_intent: Some("pi_failed".into()),
        }
    );
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn an_invalid_request_is_final_and_not_retried() {
    for status in [400, 404] {
        let (err, requests) = error_for(
            status,
            json!({"error": {"type": "invalid_request_error", "code": "resource_missing",
                   "param": "payment_method", "message": "No such payment method."}}),
        )
        .await;
        assert_eq!(err.class(), ErrorClass::Final);
        assert!(
            matches!(err, ProcessorError::Invalid { status: s, ref param, .. } if s == status && param.as_deref() == Some("payment_method"))
        );
        assert_eq!(requests, 1);
    }
}

#[tokio::test]
async fn server_errors_rate_limits_and_conflicts_are_transient_and_retried_to_the_bound() {
    let cases = [
        (500, TransientCause::ServerError(500)),
        (503, TransientCause::ServerError(503)),
        (429, TransientCause::RateLimited),
        (409, TransientCause::Conflict),
        (401, TransientCause::Authentication),
    ];
    for (status, cause) in cases {
        let (err, requests) =
            error_for(status, json!({"error": {"type": "api_error", "message": "x"}})).await;
        assert_eq!(err.class(), ErrorClass::Transient, "{status}");
        assert!(
            matches!(err, ProcessorError::Unavailable { cause: c, .. } if c == cause),
            "{status}"
        );
        assert_eq!(requests, 3, "the first try and max_retries = 2 more, for {status}");
    }
}

#[tokio::test]
async fn every_retry_reuses_the_same_key() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent_json()))
        .mount(&server)
        .await;
    client(&server).create_payment_intent(&frozen_intent()).await.unwrap();
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert_eq!(request.headers["idempotency-key"], "pay_123/charge");
        assert_eq!(form(request), form(&requests[0]), "the same parameters every time");
    }
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent_json()))
        .mount(&server)
        .await;
    let started = Instant::now();
    client(&server).create_payment_intent(&frozen_intent()).await.unwrap();
    // The back-off alone is at most 20 ms; the processor asked for a second.
    assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_timeout_is_an_unknown_outcome_not_a_final_answer() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(intent_json())
                .set_delay(Duration::from_secs(3)),
        )
        .mount(&server)
        .await;
    let mut config = config(&server.uri());
    config.request_timeout = Duration::from_millis(150);
    config.max_retries = 1;
    let client = ProcessorClient::new(config).unwrap();
    let err = client.create_payment_intent(&frozen_intent()).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::UnknownOutcome, "{err:?}");
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        2,
        "unknown outcomes are retried too"
    );
}

#[tokio::test]
async fn a_refused_connection_is_transient_because_nothing_was_sent() {
    // A port nobody listens on: bind one, note it, and close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let client = ProcessorClient::new(config(&format!("http://127.0.0.1:{port}"))).unwrap();
    let err = client.retrieve_payment_intent("pi_1").await.unwrap_err();
    assert!(
        matches!(err, ProcessorError::Unavailable { cause: TransientCause::Connect, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unreadable_success_is_reconciled_and_never_sent_again() {
    for body in ["<html>gateway</html>", r#"{"id": "pi_1", "object": "payment_intent"}"#] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_string(body))
            .expect(1)
            .mount(&server)
            .await;
        let err = client(&server).create_payment_intent(&frozen_intent()).await.unwrap_err();
        assert_eq!(err.class(), ErrorClass::Reconcile, "{body}");
        assert!(
            matches!(
                err,
                ProcessorError::MustReconcile { cause: ReconcileCause::UnreadableAnswer, .. }
            ),
            "{err:?}"
        );
    }
}

#[test]
fn the_processor_key_and_card_tokens_never_print() {
    let config = config("http://x");
    assert!(!format!("{config:?}").contains("sk_test_processor"));
    let mut request = intent_request();
    request.payment_method = "tok_4242424242424242".into();
    assert!(!format!("{request:?}").contains("4242424242"));
    let frozen = request.freeze(DownstreamKey::charge("pay_123"));
    assert!(!format!("{frozen:?}").contains("4242424242"));
}

#[test]
fn the_longest_call_counts_every_try_and_pause() {
    // 3 tries × (500 + 500) ms + 2 pauses × max(20 ms, 2 s).
    assert_eq!(config("http://x").longest_call(), Duration::from_millis(3000 + 4000));
}

#[tokio::test]
async fn an_idempotency_error_is_reconciled_not_retried_and_never_final() {
    let (err, requests) = error_for(
        400,
        json!({"error": {"type": "idempotency_error",
               "message": "Keys for idempotent requests can only be used with the same parameters they were first used with."}}),
    )
    .await;
    assert_eq!(err.class(), ErrorClass::Reconcile);
    assert!(matches!(err, ProcessorError::MustReconcile { cause: ReconcileCause::KeyReused, .. }));
    assert_eq!(requests, 1, "no retry with the key can change that answer");
}

#[tokio::test]
async fn a_500_the_processor_replays_for_the_key_is_reconciled() {
    let server = MockServer::start().await;
    // The first try's 500 is retried with the same key; the processor replays the 500 it kept.
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(500)
                .insert_header("idempotent-replayed", "true")
                .set_body_json(json!({"error": {"type": "api_error", "message": "x"}})),
        )
        .mount(&server)
        .await;
    let err = client(&server).create_payment_intent(&frozen_intent()).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Reconcile);
    assert!(matches!(
        err,
        ProcessorError::MustReconcile { cause: ReconcileCause::ReplayedFailure(500), .. }
    ));
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_unreadable_refusal_is_an_unknown_outcome_never_a_final_answer() {
    for status in [400, 402, 404] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(status).set_body_string("<html>proxy</html>"))
            .mount(&server)
            .await;
        let err = client(&server).create_payment_intent(&frozen_intent()).await.unwrap_err();
        assert_eq!(err.class(), ErrorClass::UnknownOutcome, "{status}");
        assert_eq!(server.received_requests().await.unwrap().len(), 3, "retried, {status}");
    }
}

#[tokio::test]
async fn a_frozen_request_is_sent_exactly_as_frozen() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/payment_intents"))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent_json()))
        .mount(&server)
        .await;
    let frozen = intent_request().freeze(DownstreamKey::charge("pay_123").generation(2));
    // Stored and read back, as the engine does between attempts.
    let stored = serde_json::to_value(&frozen).unwrap();
    let read: FrozenRequest = serde_json::from_value(stored).unwrap();
    client(&server).create_payment_intent(&read).await.unwrap();
    let received = &server.received_requests().await.unwrap()[0];
    assert_eq!(received.headers["idempotency-key"], "pay_123/charge/2");
    assert_eq!(form(received), frozen.form);
}

#[tokio::test]
async fn a_search_reads_every_page_of_intents_for_a_payment() {
    let server = MockServer::start().await;
    let intent = |id: &str| {
        let mut intent = intent_json();
        intent["id"] = json!(id);
        intent
    };
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents/search"))
        .and(wiremock::matchers::query_param("page", "p2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "search_result", "data": [intent("pi_2")], "has_more": false, "next_page": null})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents/search"))
        .and(wiremock::matchers::query_param("query", "metadata['payment_id']:'pay_123'"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "search_result", "data": [intent("pi_1")], "has_more": true, "next_page": "p2"})))
        .mount(&server)
        .await;
    let found = client(&server).search_payment_intents("pay_123").await.unwrap();
    let ids: Vec<&str> = found.iter().map(|intent| intent.id.as_str()).collect();
    assert_eq!(ids, ["pi_1", "pi_2"]);
    assert_eq!(found[0].metadata["payment_id"], "pay_123");
}

#[tokio::test]
async fn an_intents_refunds_are_listed_page_by_page() {
    let server = MockServer::start().await;
    let refund = |id: &str| {
        json!({"id": id, "object": "refund", "charge": "ch_1", "payment_intent": "pi_1", "amount": 100,
                                   "status": "succeeded", "metadata": {"refund_id": format!("re_{id}")}})
    };
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(wiremock::matchers::query_param("starting_after", "re_a"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(
                json!({"object": "list", "data": [refund("re_b")], "has_more": false}),
            ),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(wiremock::matchers::query_param("payment_intent", "pi_1"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(
                json!({"object": "list", "data": [refund("re_a")], "has_more": true}),
            ),
        )
        .mount(&server)
        .await;
    let found = client(&server).list_intent_refunds("pi_1").await.unwrap();
    let ids: Vec<&str> = found.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["re_a", "re_b"]);
}
