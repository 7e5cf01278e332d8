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
    let client = Client::new("http://x", "k");
    for attempt in 1..10 {
        assert!(client.backoff(attempt, None) <= Duration::from_secs(5));
    }
    assert!(client.backoff(1, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
}

#[test]
fn a_retry_after_beyond_the_cap_is_honoured_only_up_to_the_cap() {
    let policy = RetryPolicy { retry_after_cap: Duration::from_secs(3), ..RetryPolicy::default() };
    let client = Client::with_policy("http://x", "k", policy);
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
