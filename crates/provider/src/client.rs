//! The card-processor client: Stripe's wire format over reqwest, with every error typed by what
//! the caller may do about it, and bounded retries that always reuse the same downstream key.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use rand::Rng;
use reqwest::{Method, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::keys::DownstreamKey;
use crate::types::{
    Charge, ChargeRequest, ErrorBody, ErrorEnvelope, Refund, RefundRequest, mask_token,
};

/// How the processor is reached.
#[derive(Clone)]
pub struct ProcessorConfig {
    /// E.g. `http://127.0.0.1:12111`, or Stripe's API.
    pub base_url: String,
    /// The processor's secret key. Never printed.
    pub api_key: String,
    /// Limit for opening a connection.
    pub connect_timeout: Duration,
    /// Limit for a whole request, answer included.
    pub request_timeout: Duration,
    /// Retries after the first try, for transient failures and unknown outcomes.
    pub max_retries: u32,
    /// First back-off ceiling; doubles per retry (full jitter: the delay is uniform below it).
    pub backoff_base: Duration,
    /// Largest back-off ceiling.
    pub backoff_cap: Duration,
    /// Largest `Retry-After` honoured; a longer one is cut to this.
    pub retry_after_cap: Duration,
}

impl fmt::Debug for ProcessorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessorConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &"…")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}

impl ProcessorConfig {
    /// The longest one call can take, retries and back-offs included. A lease on an idempotency
    /// key must outlive this.
    pub fn longest_call(&self) -> Duration {
        let tries = self.max_retries + 1;
        let per_try = self.connect_timeout + self.request_timeout;
        let pause = self.backoff_cap.max(self.retry_after_cap);
        per_try * tries + pause * self.max_retries
    }
}

/// What the caller may do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The processor decided (a decline, an invalid request): never retry; it is the answer.
    Final,
    /// The processor did not act, or failed: retry later with the same key.
    Transient,
    /// The request may or may not have been acted on: retry later with the same key, which makes
    /// the processor return what it did, if it did anything.
    UnknownOutcome,
}

/// Why a transient failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransientCause {
    /// Could not connect: the request never left.
    Connect,
    /// A 5xx answer.
    ServerError(u16),
    /// 429.
    RateLimited,
    /// 409: a request with the same key is in progress there.
    Conflict,
    /// 401/403: our processor key is wrong. Not the customer's fault, so not a final answer to
    /// store; the key stays resumable until an operator fixes the configuration.
    Authentication,
}

/// A failed processor call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessorError {
    /// The card was declined (402). Final.
    #[error("card declined ({decline_code})")]
    Declined {
        /// Why, e.g. `insufficient_funds`.
        decline_code: String,
        /// For people.
        message: String,
        /// The failed charge, when the processor made one.
        charge_id: Option<String>,
    },
    /// The processor refused the request as invalid (400, 404, other 4xx). Final.
    #[error("invalid request to the processor ({status}): {message}")]
    Invalid {
        /// The HTTP status.
        status: u16,
        /// Stripe's error code, e.g. `resource_missing`, `idempotency_error`.
        code: Option<String>,
        /// The offending parameter.
        param: Option<String>,
        /// For people.
        message: String,
    },
    /// The processor was unavailable or failed. Transient.
    #[error("processor unavailable: {message}")]
    Unavailable {
        /// Why.
        cause: TransientCause,
        /// For logs.
        message: String,
    },
    /// The request may have been acted on; we cannot know. Retry with the same key.
    #[error("processor outcome unknown: {message}")]
    UnknownOutcome {
        /// For logs.
        message: String,
    },
}

impl ProcessorError {
    /// What the caller may do about it.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Declined { .. } | Self::Invalid { .. } => ErrorClass::Final,
            Self::Unavailable { .. } => ErrorClass::Transient,
            Self::UnknownOutcome { .. } => ErrorClass::UnknownOutcome,
        }
    }
}

/// The operations we need from a card processor. The HTTP client implements it; tests may use a
/// deterministic double.
pub trait CardProcessor: Send + Sync + 'static {
    /// Creates (and, with `capture`, captures) a charge.
    fn create_charge(
        &self,
        request: &ChargeRequest,
        key: &DownstreamKey,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// Captures an authorized charge, all of it or `amount`.
    fn capture_charge(
        &self,
        charge_id: &str,
        amount: Option<i64>,
        key: &DownstreamKey,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// Refunds a captured charge, or releases an uncaptured one.
    fn create_refund(
        &self,
        request: &RefundRequest,
        key: &DownstreamKey,
    ) -> impl Future<Output = Result<Refund, ProcessorError>> + Send;

    /// Reads a charge.
    fn retrieve_charge(
        &self,
        charge_id: &str,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// The longest a call may take, retries included (for the lease check).
    fn longest_call(&self) -> Duration;
}

/// The HTTP client.
#[derive(Debug, Clone)]
pub struct ProcessorClient {
    http: reqwest::Client,
    config: ProcessorConfig,
}

impl ProcessorClient {
    /// A client with the configured timeouts.
    pub fn new(config: ProcessorConfig) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent(concat!("payments/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { http, config })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        form: Option<&[(String, String)]>,
        key: Option<&DownstreamKey>,
    ) -> Result<T, ProcessorError> {
        let mut retries = 0;
        loop {
            let started = std::time::Instant::now();
            let (result, retry_after) = self.call_once(method.clone(), path, form, key).await;
            let elapsed = started.elapsed().as_secs_f64();
            let elapsed_ms = elapsed * 1000.0;
            let outcome = match &result {
                Ok(_) => "ok",
                Err(err) => match err.class() {
                    ErrorClass::Final => "final",
                    ErrorClass::Transient => "transient",
                    ErrorClass::UnknownOutcome => "unknown_outcome",
                },
            };
            metrics::counter!("processor_calls_total", "path" => metric_path(path), "outcome" => outcome).increment(1);
            metrics::histogram!("processor_call_duration_seconds", "path" => metric_path(path))
                .record(elapsed);
            match result {
                Ok(value) => {
                    tracing::debug!(%method, path, key = key.map(DownstreamKey::as_str), retries, elapsed_ms, "processor call succeeded");
                    return Ok(value);
                }
                Err(err)
                    if err.class() != ErrorClass::Final && retries < self.config.max_retries =>
                {
                    retries += 1;
                    let delay = self.backoff(retries, retry_after);
                    tracing::warn!(%method, path, key = key.map(DownstreamKey::as_str), retries, elapsed_ms, delay_ms = delay.as_millis() as u64, error = %err, "processor call failed; retrying with the same key");
                    tokio::time::sleep(delay).await;
                }
                Err(err) => {
                    tracing::warn!(%method, path, key = key.map(DownstreamKey::as_str), retries, elapsed_ms, error = %err, class = ?err.class(), "processor call failed");
                    return Err(err);
                }
            }
        }
    }

    /// Full jitter: uniform below an exponentially growing ceiling; never less than the
    /// processor's own `Retry-After` (capped).
    fn backoff(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self
            .config
            .backoff_base
            .saturating_mul(1 << retry.saturating_sub(1).min(16))
            .min(self.config.backoff_cap);
        let jitter = Duration::from_micros(
            rand::thread_rng()
                .gen_range(0..=u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX)),
        );
        match retry_after {
            Some(asked) => jitter.max(asked.min(self.config.retry_after_cap)),
            None => jitter,
        }
    }

    async fn call_once<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        form: Option<&[(String, String)]>,
        key: Option<&DownstreamKey>,
    ) -> (Result<T, ProcessorError>, Option<Duration>) {
        let url = format!("{}{path}", self.config.base_url.trim_end_matches('/'));
        let mut request = self.http.request(method, url).bearer_auth(&self.config.api_key);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key.as_str());
        }
        if let Some(form) = form {
            request = request.form(form);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => return (Err(transport_error(&err)), None),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = match response.bytes().await {
            Ok(body) => body,
            // The answer started and broke off: the processor may have acted.
            Err(err) => return (Err(unknown(format!("the answer broke off: {err}"))), retry_after),
        };
        if status.is_success() {
            let parsed = serde_json::from_slice(&body)
                .map_err(|err| unknown(format!("unreadable answer with status {status}: {err}")));
            return (parsed, retry_after);
        }
        (Err(status_error(status, &body)), retry_after)
    }
}

/// A path without ids, as a metric label.
fn metric_path(path: &str) -> &'static str {
    match path {
        "/v1/charges" => "/v1/charges",
        "/v1/refunds" => "/v1/refunds",
        p if p.ends_with("/capture") => "/v1/charges/{id}/capture",
        _ => "/v1/charges/{id}",
    }
}

fn unknown(message: String) -> ProcessorError {
    ProcessorError::UnknownOutcome { message }
}

fn transport_error(err: &reqwest::Error) -> ProcessorError {
    if err.is_connect() && !err.is_timeout() {
        ProcessorError::Unavailable { cause: TransientCause::Connect, message: err.to_string() }
    } else {
        // A timeout, or a connection that broke after the request was sent.
        unknown(err.to_string())
    }
}

fn status_error(status: StatusCode, body: &[u8]) -> ProcessorError {
    let error: ErrorBody = serde_json::from_slice::<ErrorEnvelope>(body)
        .map(|envelope| envelope.error)
        .unwrap_or_else(|_| ErrorBody {
            message: format!("status {status}"),
            ..ErrorBody::default()
        });
    let unavailable = |cause| ProcessorError::Unavailable {
        cause,
        message: format!("{status}: {}", error.message),
    };
    match status.as_u16() {
        402 => ProcessorError::Declined {
            decline_code: error
                .decline_code
                .clone()
                .unwrap_or_else(|| "generic_decline".to_owned()),
            message: error.message.clone(),
            charge_id: error.charge.clone(),
        },
        401 | 403 => unavailable(TransientCause::Authentication),
        409 => unavailable(TransientCause::Conflict),
        429 => unavailable(TransientCause::RateLimited),
        code @ 500..=599 => unavailable(TransientCause::ServerError(code)),
        code => ProcessorError::Invalid {
            status: code,
            code: error.code.clone(),
            param: error.param.clone(),
            message: error.message.clone(),
        },
    }
}

impl CardProcessor for ProcessorClient {
    async fn create_charge(
        &self,
        request: &ChargeRequest,
        key: &DownstreamKey,
    ) -> Result<Charge, ProcessorError> {
        let mut form = vec![
            ("amount".to_owned(), request.amount.to_string()),
            ("currency".to_owned(), request.currency.clone()),
            ("source".to_owned(), request.source.clone()),
            ("capture".to_owned(), request.capture.to_string()),
            ("metadata[payment_id]".to_owned(), request.payment_id.clone()),
        ];
        if let Some(description) = &request.description {
            form.push(("description".to_owned(), description.clone()));
        }
        tracing::debug!(payment_id = %request.payment_id, source = %mask_token(&request.source), "creating a charge");
        self.call(Method::POST, "/v1/charges", Some(&form), Some(key)).await
    }

    async fn capture_charge(
        &self,
        charge_id: &str,
        amount: Option<i64>,
        key: &DownstreamKey,
    ) -> Result<Charge, ProcessorError> {
        let form: Vec<(String, String)> =
            amount.map(|a| ("amount".to_owned(), a.to_string())).into_iter().collect();
        self.call(Method::POST, &format!("/v1/charges/{charge_id}/capture"), Some(&form), Some(key))
            .await
    }

    async fn create_refund(
        &self,
        request: &RefundRequest,
        key: &DownstreamKey,
    ) -> Result<Refund, ProcessorError> {
        let mut form = vec![
            ("charge".to_owned(), request.charge_id.clone()),
            ("metadata[payment_id]".to_owned(), request.payment_id.clone()),
        ];
        if let Some(refund_id) = &request.refund_id {
            form.push(("metadata[refund_id]".to_owned(), refund_id.clone()));
        }
        if let Some(amount) = request.amount {
            form.push(("amount".to_owned(), amount.to_string()));
        }
        if let Some(reason) = &request.reason {
            form.push(("reason".to_owned(), reason.clone()));
        }
        self.call(Method::POST, "/v1/refunds", Some(&form), Some(key)).await
    }

    async fn retrieve_charge(&self, charge_id: &str) -> Result<Charge, ProcessorError> {
        self.call(Method::GET, &format!("/v1/charges/{charge_id}"), None, None).await
    }

    fn longest_call(&self) -> Duration {
        self.config.longest_call()
    }
}
