//! Each PaymentIntent call on the wire: its method and path, its form in order, its key, the
//! pinned `Stripe-Version`, and the paging of its lookups.

use provider::{
    CardProcessor, DownstreamKey, FrozenRequest, IntentStatus, PaymentIntentRequest,
    ProcessorClient, RefundRequest,
};
use serde_json::json;
use wiremock::matchers::{header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{VERSION, client, config, fixture, form, pairs};

fn request(capture: bool) -> PaymentIntentRequest {
    PaymentIntentRequest {
        payment_id: "pay_123".into(),
        amount: 2000,
        currency: "usd".into(),
        payment_method: "pm_card_visa".into(),
        capture,
        description: Some("Two books & a pen".into()),
        metadata: [("release".to_owned(), "0042".to_owned())].into(),
        return_url: "https://pay.example.com/v1/payments/pay_123/return".into(),
    }
}

/// A server whose one mock, for `verb` and `route`, with the pinned version and `key` (or none),
/// answers `body` exactly once.
async fn serving(
    verb: &str,
    route: &str,
    key: Option<&str>,
    body: serde_json::Value,
) -> MockServer {
    let server = MockServer::start().await;
    let mut mock = Mock::given(method(verb))
        .and(path(route))
        .and(header("authorization", "Bearer sk_test_processor"))
        .and(header("stripe-version", VERSION));
    if let Some(key) = key {
        mock = mock.and(header("idempotency-key", key));
    }
    mock.respond_with(ResponseTemplate::new(200).set_body_json(body))
        .expect(1)
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn a_payment_intent_is_created_and_confirmed_as_stripe_expects() {
    let server = serving(
        "POST",
        "/v1/payment_intents",
        Some("pay_123/charge"),
        fixture("payment_intent_full"),
    )
    .await;
    let frozen = request(true).freeze(DownstreamKey::charge("pay_123"));
    let intent = client(&server).create_payment_intent(&frozen).await.unwrap();
    assert_eq!(
        (intent.id.as_str(), intent.status),
        ("pi_3QxFull0000000001", IntentStatus::Succeeded)
    );

    let received = &server.received_requests().await.unwrap()[0];
    assert_eq!(received.headers["content-type"], "application/x-www-form-urlencoded");
    assert_eq!(
        pairs(&form(received)),
        [
            ("amount", "2000"),
            ("currency", "usd"),
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
            ("capture_method", "automatic"),
            ("allowed_payment_method_types[0]", "card"),
            ("return_url", "https://pay.example.com/v1/payments/pay_123/return"),
            ("metadata[payment_id]", "pay_123"),
            ("metadata[release]", "0042"),
            ("description", "Two books & a pen"),
        ]
    );
}

#[tokio::test]
async fn an_authorization_only_is_created_with_manual_capture_and_its_action_read() {
    let answer = fixture("payment_intent_requires_action_redirect");
    let server = serving("POST", "/v1/payment_intents", Some("pay_123/charge/2"), answer).await;
    let frozen = request(false).freeze(DownstreamKey::charge("pay_123").generation(2));
    let intent = client(&server).create_payment_intent(&frozen).await.unwrap();
    assert!(intent.needs_action());
    assert!(intent.action_url().is_some_and(|url| url.starts_with("https://hooks.stripe.com/")));
    let received = &server.received_requests().await.unwrap()[0];
    assert_eq!(form(received), frozen.form, "sent exactly as frozen");
    assert_eq!(frozen.field("capture_method"), Some("manual"));
}

#[tokio::test]
async fn a_capture_sends_the_amount_to_capture_under_its_own_key() {
    let mut captured = fixture("payment_intent_expanded_charge");
    captured["id"] = json!("pi_1");
    let route = "/v1/payment_intents/pi_1/capture";
    let server = serving("POST", route, Some("pay_123/capture/k7"), captured).await;
    let capture =
        FrozenRequest::capture_intent("pi_1", Some(500), DownstreamKey::capture("pay_123", 7));
    let intent = client(&server).capture_payment_intent(&capture).await.unwrap();
    assert_eq!((intent.amount_received, intent.status), (Some(500), IntentStatus::Succeeded));
    let received = &server.received_requests().await.unwrap()[0];
    assert_eq!(pairs(&form(received)), [("amount_to_capture", "500")]);
}

#[tokio::test]
async fn a_cancel_sends_its_reason_under_its_own_key() {
    let canceled = json!({"id": "pi_1", "object": "payment_intent", "amount": 500,
                          "currency": "usd", "status": "canceled",
                          "cancellation_reason": "requested_by_customer"});
    let route = "/v1/payment_intents/pi_1/cancel";
    let server = serving("POST", route, Some("pay_123/cancel/k8"), canceled).await;
    let cancel = FrozenRequest::cancel_intent(
        "pi_1",
        Some("requested_by_customer"),
        DownstreamKey::cancel("pay_123", 8),
    );
    let intent = client(&server).cancel_payment_intent(&cancel).await.unwrap();
    assert_eq!(intent.status, IntentStatus::Canceled);
    assert_eq!(intent.cancellation_reason.as_deref(), Some("requested_by_customer"));
    let received = &server.received_requests().await.unwrap()[0];
    assert_eq!(pairs(&form(received)), [("cancellation_reason", "requested_by_customer")]);
}

#[tokio::test]
async fn a_refund_of_a_payment_intent_names_the_intent_not_a_charge() {
    let server =
        serving("POST", "/v1/refunds", Some("re_9/refund"), fixture("refund_of_payment_intent"))
            .await;
    let refund = RefundRequest {
        charge_id: None,
        payment_intent: Some("pi_3QxFull0000000001".into()),
        payment_id: "pay_123".into(),
        refund_id: Some("re_9".into()),
        amount: Some(200),
        reason: Some("requested_by_customer".into()),
    };
    let made =
        client(&server).create_refund(&refund.freeze(DownstreamKey::refund("re_9"))).await.unwrap();
    assert_eq!(made.payment_intent.as_deref(), Some("pi_3QxFull0000000001"));
    let received = &server.received_requests().await.unwrap()[0];
    assert_eq!(
        pairs(&form(received)),
        [
            ("payment_intent", "pi_3QxFull0000000001"),
            ("metadata[payment_id]", "pay_123"),
            ("metadata[refund_id]", "re_9"),
            ("amount", "200"),
            ("reason", "requested_by_customer"),
        ]
    );
}

#[tokio::test]
async fn a_payment_intent_is_read_with_the_version_and_no_key() {
    let route = "/v1/payment_intents/pi_3QxFull0000000001";
    let server = serving("GET", route, None, fixture("payment_intent_full")).await;
    let intent = client(&server).retrieve_payment_intent("pi_3QxFull0000000001").await.unwrap();
    assert!(intent.is_of("pay_123"));
    let received = &server.received_requests().await.unwrap()[0];
    assert!(!received.headers.contains_key("idempotency-key"), "a read is never stored");
    assert!(received.body.is_empty());
}

#[tokio::test]
async fn without_a_configured_version_no_stripe_version_is_sent() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(fixture("payment_intent_sparse")))
        .expect(1)
        .mount(&server)
        .await;
    let mut unpinned = config(&server.uri());
    unpinned.stripe_version = None;
    let client = ProcessorClient::new(unpinned).unwrap();
    client.retrieve_payment_intent("pi_sparse").await.unwrap();
    let received = &server.received_requests().await.unwrap()[0];
    assert!(!received.headers.contains_key("stripe-version"));
}

#[tokio::test]
async fn a_search_reads_every_page_of_intents_for_a_payment() {
    let server = MockServer::start().await;
    let intent = |id: &str| {
        let mut intent = fixture("payment_intent_full");
        intent["id"] = json!(id);
        intent
    };
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents/search"))
        .and(query_param("page", "p2"))
        .and(header("stripe-version", VERSION))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "search_result", "data": [intent("pi_2")], "has_more": false,
            "next_page": null, "url": "/v1/payment_intents/search"})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents/search"))
        .and(query_param("query", "metadata['payment_id']:'pay_123'"))
        .and(query_param("limit", "100"))
        .and(header("stripe-version", VERSION))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "search_result", "data": [intent("pi_1")], "has_more": true,
            "next_page": "p2", "url": "/v1/payment_intents/search"})))
        .expect(1)
        .mount(&server)
        .await;
    let found = client(&server).search_payment_intents("pay_123").await.unwrap();
    let ids: Vec<&str> = found.iter().map(|intent| intent.id.as_str()).collect();
    assert_eq!(ids, ["pi_1", "pi_2"]);
    assert!(found.iter().all(|intent| intent.is_of("pay_123")));
}

#[tokio::test]
async fn an_intents_refunds_are_listed_page_by_page() {
    let server = MockServer::start().await;
    let refund = |id: &str| {
        let mut refund = fixture("refund_of_payment_intent");
        refund["id"] = json!(id);
        refund
    };
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("payment_intent", "pi_1"))
        .and(query_param("starting_after", "re_a"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(
                json!({"object": "list", "data": [refund("re_b")], "has_more": false}),
            ),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("payment_intent", "pi_1"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(
                json!({"object": "list", "data": [refund("re_a")], "has_more": true}),
            ),
        )
        .mount(&server)
        .await;
    let found = client(&server).list_intent_refunds("pi_1").await.unwrap();
    let ids: Vec<&str> = found.iter().map(|refund| refund.id.as_str()).collect();
    assert_eq!(ids, ["re_a", "re_b"]);
    let first = &server.received_requests().await.unwrap()[0];
    assert_eq!(first.url.query(), Some("payment_intent=pi_1&limit=100"));
}
