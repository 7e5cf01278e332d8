//! The PaymentIntent calls: answers recorded as Stripe sends them (newer, sparse and older shapes)
//! read for what the code needs, and each call against wiremock (method, path, form in order,
//! keys, the pinned `Stripe-Version`, paging, and the answers that must not be retried).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

mod calls;
mod recorded;
mod refusals;

use std::time::Duration;

use provider::{ProcessorClient, ProcessorConfig};
use wiremock::{MockServer, Request};

/// The version the client is configured to send in these tests.
const VERSION: &str = "2026-10-28.endive";

/// A recorded answer from `tests/fixtures/`.
fn fixture(name: &str) -> serde_json::Value {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{path}: {err}"))
}

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
        stripe_version: Some(VERSION.to_owned()),
    }
}

fn client(server: &MockServer) -> ProcessorClient {
    ProcessorClient::new(config(&server.uri())).unwrap()
}

/// The form a request sent, in the order sent.
fn form(request: &Request) -> Vec<(String, String)> {
    serde_urlencoded::from_bytes(&request.body).unwrap()
}

/// The form as `(name, value)` pairs of text, for comparing with a literal.
fn pairs(form: &[(String, String)]) -> Vec<(&str, &str)> {
    form.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect()
}
