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
    assert_eq!(Code::parse("brand_new"), Code::Other("brand_new".into()));
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
