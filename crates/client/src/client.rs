//! The client ([`Client`]): one method per call of the API, each money-moving one an operation
//! under one `Idempotency-Key` that every retry sends again, and the answer with what it took to
//! get it ([`Idempotent`]).

use std::time::Duration;

use reqwest::{Method, header};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::retry::is_retryable;
use crate::{ClientBuilder, Code, Error, List, NewPayment, Payment, Problem, Refund, RetryPolicy};

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

/// The client. Its `Debug` never shows the secret key.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    secret: String,
    pub(crate) policy: RetryPolicy,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base_url", &self.base_url)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for the API at `base_url`, acting with the secret key `secret`, with the default
    /// retry policy and timeouts ([`ClientBuilder`] for others).
    pub fn new(base_url: &str, secret: &str) -> Result<Self, Error> {
        Self::builder(base_url, secret).build()
    }

    /// A client to make with options other than the defaults.
    pub fn builder(base_url: &str, secret: &str) -> ClientBuilder {
        ClientBuilder::new(base_url, secret)
    }

    pub(crate) fn from_parts(
        http: reqwest::Client,
        base_url: String,
        secret: String,
        policy: RetryPolicy,
    ) -> Self {
        Self { http, base_url, secret, policy }
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
                .bearer_auth(&self.secret);
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
}
