//! Tests of the client's rules: which answers are retried, the back-off's bounds, typed codes.

use std::time::Duration;

use reqwest::StatusCode;

use super::*;
use crate::retry::is_retryable;

#[test]
fn only_in_use_rate_limits_and_server_errors_are_retried() {
    for status in [409, 429, 500, 503] {
        assert!(is_retryable(StatusCode::from_u16(status).unwrap()), "{status}");
    }
    for status in [200, 201, 400, 401, 402, 404, 412, 422] {
        assert!(!is_retryable(StatusCode::from_u16(status).unwrap()), "{status}");
    }
}

#[test]
fn the_backoff_stays_under_its_ceiling_and_honours_retry_after() {
    let client = Client::new("http://x", "k").unwrap();
    for attempt in 1..10 {
        assert!(client.backoff(attempt, None) <= Duration::from_secs(5));
    }
    assert!(client.backoff(1, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
}

#[test]
fn a_retry_after_beyond_the_cap_is_honoured_only_up_to_the_cap() {
    let policy = RetryPolicy { retry_after_cap: Duration::from_secs(3), ..RetryPolicy::default() };
    let client = Client::builder("http://x", "k").retry_policy(policy).build().unwrap();
    for attempt in 1..10 {
        let wait = client.backoff(attempt, Some(Duration::from_secs(3600)));
        assert!(wait >= Duration::from_secs(3) && wait <= Duration::from_secs(5), "{wait:?}");
    }
}

#[test]
fn codes_are_typed() {
    assert_eq!(Code::parse("card_declined"), Code::CardDeclined);
    assert_eq!(Code::parse("idempotency_key_missing"), Code::IdempotencyKeyInvalid);
    assert_eq!(Code::parse("payment_requires_action"), Code::PaymentRequiresAction);
    assert_eq!(Code::parse("brand_new"), Code::Other("brand_new".into()));
}

/// A payment that waits on its customer, byte for byte as the API writes one.
const REQUIRES_ACTION: &str = r#"{"id":"pay_3ds","object":"payment","amount":500,"currency":"usd","status":"requires_action","next_action":{"type":"redirect_to_url","redirect_to_url":{"url":"http://127.0.0.1:12111/_sim/authenticate/pi_1"}},"capture_method":"manual","amount_captured":0,"amount_refunded":0,"refunded":false,"payment_method":"pm_card_threeDSecure2Required","description":null,"metadata":{},"receipt_email":null,"processor_payment_intent_id":"pi_1","processor_charge_id":null,"failure_code":null,"failure_message":null,"cancellation_reason":null,"created":1764441600,"livemode":false}"#;

#[test]
fn a_payment_that_requires_action_reads_with_where_to_send_the_customer() {
    let payment: Payment = serde_json::from_str(REQUIRES_ACTION).unwrap();
    assert_eq!(payment.status, PaymentStatus::RequiresAction);
    assert_eq!(payment.status, "requires_action");
    assert_eq!(payment.status.to_string(), "requires_action");
    let url = "http://127.0.0.1:12111/_sim/authenticate/pi_1";
    let action = NextAction {
        kind: "redirect_to_url".into(),
        redirect_to_url: Some(RedirectToUrl { url: url.into() }),
    };
    assert_eq!(payment.next_action, Some(action));
    assert_eq!(payment.redirect_url(), Some(url));
    assert_eq!(payment.processor_payment_intent_id.as_deref(), Some("pi_1"));
    assert_eq!(payment.processor_charge_id, None);
}

#[test]
fn a_settled_payment_has_no_next_action_and_every_status_reads() {
    let settled = REQUIRES_ACTION
        .replace(r#""status":"requires_action""#, r#""status":"requires_capture""#)
        .replace(
            r#""next_action":{"type":"redirect_to_url","redirect_to_url":{"url":"http://127.0.0.1:12111/_sim/authenticate/pi_1"}}"#,
            r#""next_action":null"#,
        );
    let payment: Payment = serde_json::from_str(&settled).unwrap();
    assert_eq!(payment.status, PaymentStatus::RequiresCapture);
    assert_eq!((&payment.next_action, payment.redirect_url()), (&None, None));
    let statuses = [
        ("processing", PaymentStatus::Processing),
        ("requires_action", PaymentStatus::RequiresAction),
        ("requires_capture", PaymentStatus::RequiresCapture),
        ("succeeded", PaymentStatus::Succeeded),
        ("failed", PaymentStatus::Failed),
        ("canceled", PaymentStatus::Canceled),
    ];
    for (name, status) in statuses {
        assert_eq!(PaymentStatus::parse(name), status);
        assert_eq!(status.as_str(), name);
    }
}

#[test]
fn an_unknown_status_and_an_unknown_next_action_still_read() {
    let newer = REQUIRES_ACTION
        .replace(r#""status":"requires_action""#, r#""status":"requires_confirmation""#)
        .replace(
            r#"{"type":"redirect_to_url","redirect_to_url":{"url":"http://127.0.0.1:12111/_sim/authenticate/pi_1"}}"#,
            r#"{"type":"use_stripe_sdk","use_stripe_sdk":{}}"#,
        );
    let payment: Payment = serde_json::from_str(&newer).unwrap();
    assert_eq!(payment.status, PaymentStatus::Other("requires_confirmation".into()));
    assert_eq!(payment.next_action.as_ref().map(|a| a.kind.as_str()), Some("use_stripe_sdk"));
    assert_eq!(payment.redirect_url(), None);
}

#[test]
fn a_payment_from_a_server_without_the_new_members_still_reads() {
    let older = REQUIRES_ACTION
        .replace(r#""status":"requires_action""#, r#""status":"succeeded""#)
        .replace(
            r#""next_action":{"type":"redirect_to_url","redirect_to_url":{"url":"http://127.0.0.1:12111/_sim/authenticate/pi_1"}},"#,
            "",
        )
        .replace(r#""processor_payment_intent_id":"pi_1","#, "");
    assert!(!older.contains("next_action") && !older.contains("pi_1"), "{older}");
    let payment: Payment = serde_json::from_str(&older).unwrap();
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!((payment.next_action, payment.processor_payment_intent_id), (None, None));
}

#[test]
fn no_debug_prints_the_secret_key() {
    let key = "sk_test_4eC39HqLyjWDarjtT1zdp7dc";
    let builder = Client::builder("http://127.0.0.1:8080", key);
    let client = builder.clone().build().unwrap();
    let printed = format!("{client:?} {builder:?}");
    assert!(printed.contains("127.0.0.1:8080"), "{printed}");
    assert!(!printed.contains("4eC39HqL"), "{printed}");
}

/// A listener whose queue of connections to accept is full: a new connection's handshake gets no
/// answer, as from a host that drops packets. Its address, and what must stay open meanwhile.
async fn black_hole() -> (String, tokio::net::TcpListener, Vec<tokio::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    // Connections nobody accepts fill the queue; once it is full, handshakes go unanswered.
    let mut held = Vec::new();
    while let Ok(Ok(stream)) =
        tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(address))
            .await
    {
        held.push(stream);
        assert!(held.len() < 64, "the queue never filled");
    }
    (format!("http://{address}"), listener, held)
}

#[tokio::test]
async fn a_connection_that_never_opens_ends_the_try_at_the_connect_timeout() {
    let (url, _listener, _held) = black_hole().await;
    let policy = RetryPolicy { max_attempts: 2, base: Duration::ZERO, ..RetryPolicy::default() };
    let client = Client::builder(&url, "k")
        .retry_policy(policy)
        .connect_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let call = client.payment("pay_1");
    let ended = tokio::time::timeout(Duration::from_secs(10), call).await;
    match ended {
        Ok(Err(Error::GaveUp { attempts: 2, .. })) => {}
        other => panic!("two tries that time out, then the end: {other:?}"),
    }
}

#[tokio::test]
async fn a_server_that_never_answers_ends_the_try_at_the_request_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accepts, reads, never answers.
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let policy = RetryPolicy { max_attempts: 2, base: Duration::ZERO, ..RetryPolicy::default() };
    let client = Client::builder(&url, "k")
        .retry_policy(policy)
        .request_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), client.payment("pay_1")).await;
    match ended {
        Ok(Err(Error::GaveUp { attempts: 2, last, .. })) => assert!(last.contains("transport")),
        other => panic!("two tries that time out, then the end: {other:?}"),
    }
}
