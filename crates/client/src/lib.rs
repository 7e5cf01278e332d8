//! A typed async client for the payments API that retries safely.
//!
//! Half of idempotency is the client. Every money-moving call here is one *operation* with one
//! `Idempotency-Key` (a fresh UUIDv4 unless the caller gives one), and every retry of that
//! operation sends the same key, so the server runs it at most once and answers every retry with
//! the original result.
//!
//! - Network errors, timeouts, `409` (the first request is still running), `429` and `5xx` are
//!   retried with full-jitter exponential back-off, never sooner than `Retry-After` says, up to a
//!   bound; the error that ends the retries carries the key, so the caller can ask again later.
//! - Any other answer is final: a replayed answer (`Idempotent-Replayed: true`) is as final as a
//!   fresh one, and problem `code`s become typed errors.
//!
//! ```no_run
//! # async fn example() -> Result<(), payments_client::Error> {
//! use payments_client::{Client, NewPayment};
//!
//! let client = Client::new("http://127.0.0.1:8080", "sk_test_…");
//! let payment = client.create_payment(&NewPayment::new(500, "usd", "pm_card_visa"), None).await?;
//! println!("{} ({}), key {}", payment.value.id, payment.value.status, payment.key);
//! # Ok(()) }
//! ```

mod error;
pub mod webhooks;

pub use error::{Code, Error, Problem};

use std::collections::BTreeMap;
use std::time::Duration;

use payments_backoff::{Backoff, Jitter};
use reqwest::{Method, StatusCode, header};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How hard the client tries.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub max_attempts: u32,
    /// First back-off ceiling; doubles per retry.
    pub base: Duration,
    /// Largest back-off ceiling.
    pub cap: Duration,
    /// Limit for one request.
    pub request_timeout: Duration,
    /// The longest `Retry-After` honoured: a server (or a proxy on the way) that asks for an
    /// hour does not get to park the caller for an hour.
    pub retry_after_cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            retry_after_cap: Duration::from_secs(30),
        }
    }
}

/// A payment, as the API represents it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Payment {
    /// `pay_…`
    pub id: String,
    /// Minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// `processing`, `requires_capture`, `succeeded`, `failed`, `canceled`.
    pub status: String,
    /// `automatic` or `manual`.
    pub capture_method: String,
    /// Captured so far.
    pub amount_captured: i64,
    /// Refunded so far.
    pub amount_refunded: i64,
    /// Whether all of it was refunded.
    pub refunded: bool,
    /// The payment method token.
    pub payment_method: String,
    /// Free text.
    pub description: Option<String>,
    /// String pairs.
    pub metadata: BTreeMap<String, String>,
    /// The processor's charge.
    pub processor_charge_id: Option<String>,
    /// Decline code, for a failed payment.
    pub failure_code: Option<String>,
    /// Unix seconds.
    pub created: i64,
}

/// A refund, as the API represents it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Refund {
    /// `re_…`
    pub id: String,
    /// The refunded payment.
    pub payment: String,
    /// Minor units.
    pub amount: i64,
    /// `succeeded`, …
    pub status: String,
}

/// A page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct List<T> {
    /// Newest first.
    pub data: Vec<T>,
    /// Whether more lie beyond.
    pub has_more: bool,
}

/// `POST /v1/payments`
#[derive(Debug, Clone, Serialize)]
pub struct NewPayment {
    /// Minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// A payment method token.
    pub payment_method: String,
    /// `automatic` (default) or `manual`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_method: Option<String>,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// String pairs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Where to send a receipt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_email: Option<String>,
}

impl NewPayment {
    /// A payment of `amount` minor units of `currency` with `payment_method`.
    pub fn new(amount: i64, currency: &str, payment_method: &str) -> Self {
        Self {
            amount,
            currency: currency.to_owned(),
            payment_method: payment_method.to_owned(),
            capture_method: None,
            description: None,
            metadata: BTreeMap::new(),
            receipt_email: None,
        }
    }
}

/// The answer to an idempotent call, with what it took to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotent<T> {
    /// The answer.
    pub value: T,
    /// The key the operation ran under; keep it to ask again later.
    pub key: String,
    /// Whether the server replayed a stored answer.
    pub replayed: bool,
    /// Requests it took.
    pub attempts: u32,
}

/// The client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    secret: String,
    policy: RetryPolicy,
}

impl Client {
    /// A client for the API at `base_url`, acting with the secret key `secret`.
    pub fn new(base_url: &str, secret: &str) -> Self {
        Self::with_policy(base_url, secret, RetryPolicy::default())
    }

    /// A client with its own retry policy.
    pub fn with_policy(base_url: &str, secret: &str, policy: RetryPolicy) -> Self {
        Self {
            http: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            secret: secret.to_owned(),
            policy,
        }
    }

    /// Creates a payment. `key` names the operation; `None` makes a fresh UUIDv4.
    pub async fn create_payment(
        &self,
        payment: &NewPayment,
        key: Option<&str>,
    ) -> Result<Idempotent<Payment>, Error> {
        self.post(
            "/v1/payments",
            &serde_json::to_value(payment).map_err(|e| Error::Decode(e.to_string()))?,
            key,
        )
        .await
    }

    /// Captures an authorized payment (all of it, or `amount`).
    pub async fn capture_payment(
        &self,
        id: &str,
        amount: Option<i64>,
        key: Option<&str>,
    ) -> Result<Idempotent<Payment>, Error> {
        let body = match amount {
            Some(amount) => serde_json::json!({ "amount_to_capture": amount }),
            None => serde_json::json!({}),
        };
        self.post(&format!("/v1/payments/{id}/capture"), &body, key).await
    }

    /// Cancels an authorized payment.
    pub async fn cancel_payment(
        &self,
        id: &str,
        key: Option<&str>,
    ) -> Result<Idempotent<Payment>, Error> {
        self.post(&format!("/v1/payments/{id}/cancel"), &serde_json::json!({}), key).await
    }

    /// Refunds a captured payment (what remains, or `amount`).
    pub async fn refund_payment(
        &self,
        id: &str,
        amount: Option<i64>,
        key: Option<&str>,
    ) -> Result<Idempotent<Refund>, Error> {
        let body = match amount {
            Some(amount) => serde_json::json!({ "amount": amount }),
            None => serde_json::json!({}),
        };
        self.post(&format!("/v1/payments/{id}/refunds"), &body, key).await
    }

    /// Reads a payment.
    pub async fn payment(&self, id: &str) -> Result<Payment, Error> {
        self.call(Method::GET, &format!("/v1/payments/{id}"), None, None)
            .await
            .map(|answer| answer.value)
    }

    /// A page of payments, newest first.
    pub async fn payments(
        &self,
        limit: u32,
        starting_after: Option<&str>,
    ) -> Result<List<Payment>, Error> {
        let mut path = format!("/v1/payments?limit={limit}");
        if let Some(after) = starting_after {
            path.push_str(&format!("&starting_after={after}"));
        }
        self.call(Method::GET, &path, None, None).await.map(|answer| answer.value)
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        key: Option<&str>,
    ) -> Result<Idempotent<T>, Error> {
        let key = key.map(str::to_owned).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        self.call(Method::POST, path, Some(body), Some(key)).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        key: Option<String>,
    ) -> Result<Idempotent<T>, Error> {
        let mut last = String::new();
        for attempt in 1..=self.policy.max_attempts {
            let mut request = self
                .http
                .request(method.clone(), format!("{}{path}", self.base_url))
                .bearer_auth(&self.secret)
                .timeout(self.policy.request_timeout);
            if let Some(key) = &key {
                request = request.header("Idempotency-Key", key);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let mut retry_after = None;
            match request.send().await {
                Err(err) => last = format!("transport: {err}"),
                Ok(response) => {
                    let status = response.status();
                    let replayed =
                        response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
                    retry_after = response
                        .headers()
                        .get(header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .map(Duration::from_secs);
                    match response.bytes().await {
                        Err(err) => last = format!("the answer broke off: {err}"),
                        Ok(bytes) if is_retryable(status) => {
                            last = format!("{status}: {}", String::from_utf8_lossy(&bytes));
                        }
                        Ok(bytes) if status.is_success() => {
                            let value = serde_json::from_slice(&bytes)
                                .map_err(|e| Error::Decode(e.to_string()))?;
                            return Ok(Idempotent {
                                value,
                                key: key.unwrap_or_default(),
                                replayed,
                                attempts: attempt,
                            });
                        }
                        Ok(bytes) => {
                            let problem: Problem = serde_json::from_slice(&bytes)
                                .map_err(|e| Error::Decode(format!("{status}: {e}")))?;
                            return Err(Error::Api {
                                code: Code::parse(&problem.code),
                                problem: Box::new(problem),
                                key,
                                replayed,
                            });
                        }
                    }
                }
            }
            if attempt < self.policy.max_attempts {
                tokio::time::sleep(self.backoff(attempt, retry_after)).await;
            }
        }
        Err(Error::GaveUp { key, attempts: self.policy.max_attempts, last })
    }

    /// Full jitter below an exponentially growing ceiling, never sooner than `Retry-After` (as
    /// far as `retry_after_cap`).
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        Backoff::new(self.policy.base, self.policy.cap, Jitter::Full).delay_honouring(
            attempt,
            retry_after,
            self.policy.retry_after_cap,
        )
    }
}

/// Whether an answer says "try again" rather than "this is the result".
fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let policy =
            RetryPolicy { retry_after_cap: Duration::from_secs(3), ..RetryPolicy::default() };
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
}
