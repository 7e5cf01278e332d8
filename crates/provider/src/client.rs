//! The card-processor client: Stripe's wire format over reqwest, with every error typed by what
//! the caller may do about it, and bounded retries that always reuse the same downstream key.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use payments_backoff::{Backoff, Jitter};
use reqwest::{Method, StatusCode, header};
use serde::de::DeserializeOwned;

use serde::Deserialize;

use crate::keys::DownstreamKey;
use crate::types::{Charge, ErrorBody, ErrorEnvelope, FrozenRequest, Refund, mask_token};

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
    /// How far the processor's search may trail its writes (Stripe: up to about a minute). A
    /// search that finds nothing proves nothing until the call it looks for is older than this
    /// plus the longest call.
    pub search_lag: Duration,
}

impl fmt::Debug for ProcessorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessorConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &"…")
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("search_lag", &self.search_lag)
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
    /// The processor will not tell us, under this key, what the first request with it did (it
    /// refuses our retry as different, or replays a failure it stored for the key): no retry
    /// with the key can help. Look the object up by our own id instead (reconcile).
    Reconcile,
}

/// Why an answer leaves the first request's outcome to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileCause {
    /// `400 idempotency_error`: the key was first used with other parameters (an earlier release
    /// built the request differently, or someone else used the key).
    KeyReused,
    /// A 5xx replayed for the key (`Idempotent-Replayed: true`): the processor stored a failure
    /// of the first request, which may have acted before it failed, and will answer it for ever.
    ReplayedFailure(u16),
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
    /// The key can no longer tell us what the first request with it did. Never a final answer:
    /// look the object up.
    #[error("processor outcome must be reconciled ({cause:?}): {message}")]
    MustReconcile {
        /// Which answer said so.
        cause: ReconcileCause,
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
            Self::MustReconcile { .. } => ErrorClass::Reconcile,
        }
    }
}

/// The operations we need from a card processor. The HTTP client implements it; tests may use a
/// deterministic double. The money-moving calls take a [`FrozenRequest`]: what is sent was
/// decided, and stored, before the first attempt.
pub trait CardProcessor: Send + Sync + 'static {
    /// Creates (and, with `capture`, captures) a charge: `POST /v1/charges`.
    fn create_charge(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// Captures an authorized charge: `POST /v1/charges/{id}/capture`.
    fn capture_charge(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// Refunds a captured charge, or releases an uncaptured one: `POST /v1/refunds`.
    fn create_refund(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<Refund, ProcessorError>> + Send;

    /// Reads a charge.
    fn retrieve_charge(
        &self,
        charge_id: &str,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// The charges whose `metadata[payment_id]` is `payment_id`, through the processor's search,
    /// which may trail writes by up to [`CardProcessor::search_lag`].
    fn search_charges(
        &self,
        payment_id: &str,
    ) -> impl Future<Output = Result<Vec<Charge>, ProcessorError>> + Send;

    /// Every refund of a charge (a consistent list, no lag).
    fn list_refunds(
        &self,
        charge_id: &str,
    ) -> impl Future<Output = Result<Vec<Refund>, ProcessorError>> + Send;

    /// The longest a call may take, retries included (for the lease check).
    fn longest_call(&self) -> Duration;

    /// How far the processor's search may trail its writes.
    fn search_lag(&self) -> Duration;
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
            // A read is only ever retried here, never stored: no key needed.
            let (result, retry_after) = self.call_once(method.clone(), path, form, key).await;
            let elapsed = started.elapsed().as_secs_f64();
            let elapsed_ms = elapsed * 1000.0;
            let outcome = match &result {
                Ok(_) => "ok",
                Err(err) => match err.class() {
                    ErrorClass::Final => "final",
                    ErrorClass::Transient => "transient",
                    ErrorClass::UnknownOutcome => "unknown_outcome",
                    ErrorClass::Reconcile => "reconcile",
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
                    if matches!(
                        err.class(),
                        ErrorClass::Transient | ErrorClass::UnknownOutcome
                    ) && retries < self.config.max_retries =>
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
        Backoff::new(self.config.backoff_base, self.config.backoff_cap, Jitter::Full)
            .delay_honouring(retry, retry_after, self.config.retry_after_cap)
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
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
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
        (Err(status_error(status, &body, replayed)), retry_after)
    }
}

/// A path without ids, as a metric label.
fn metric_path(path: &str) -> &'static str {
    match path {
        "/v1/charges" => "/v1/charges",
        "/v1/refunds" => "/v1/refunds",
        p if p.starts_with("/v1/refunds?") => "/v1/refunds",
        p if p.starts_with("/v1/charges/search") => "/v1/charges/search",
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

fn status_error(status: StatusCode, body: &[u8], replayed: bool) -> ProcessorError {
    let unavailable = |cause, message: &str| ProcessorError::Unavailable {
        cause,
        message: format!("{status}: {message}"),
    };
    let parsed = serde_json::from_slice::<ErrorEnvelope>(body).map(|envelope| envelope.error);
    match (status.as_u16(), parsed) {
        // A failure the processor stored for the key and replays: a retry can only get it again.
        (code @ 500..=599, _) if replayed => ProcessorError::MustReconcile {
            cause: ReconcileCause::ReplayedFailure(code),
            message: format!("the processor replays a {status} for this key"),
        },
        (401 | 403, error) => unavailable(TransientCause::Authentication, &message_of(error)),
        (409, error) => unavailable(TransientCause::Conflict, &message_of(error)),
        (429, error) => unavailable(TransientCause::RateLimited, &message_of(error)),
        (code @ 500..=599, error) => {
            unavailable(TransientCause::ServerError(code), &message_of(error))
        }
        (_, Ok(error)) if error.type_ == "idempotency_error" => ProcessorError::MustReconcile {
            cause: ReconcileCause::KeyReused,
            message: error.message,
        },
        (402, Ok(error)) => ProcessorError::Declined {
            decline_code: error.decline_code.unwrap_or_else(|| "generic_decline".to_owned()),
            message: error.message,
            charge_id: error.charge,
        },
        (code, Ok(error)) => ProcessorError::Invalid {
            status: code,
            code: error.code,
            param: error.param,
            message: error.message,
        },
        // A refusal we cannot read is no answer to store: we do not know what was refused.
        (_, Err(err)) => unknown(format!("an unreadable error answer with status {status}: {err}")),
    }
}

fn message_of(error: Result<ErrorBody, serde_json::Error>) -> String {
    error.map(|e| e.message).unwrap_or_else(|_| "(no readable error body)".to_owned())
}

/// Stripe's search result page.
#[derive(Debug, Deserialize)]
struct SearchPage<T> {
    data: Vec<T>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    next_page: Option<String>,
}

/// Stripe's list page.
#[derive(Debug, Deserialize)]
struct ListPage<T> {
    data: Vec<T>,
    #[serde(default)]
    has_more: bool,
}

/// Lookups read at most this many pages: a reconciliation looks for one object, and a runaway
/// cursor must not hold a lease for ever.
const MAX_PAGES: usize = 10;

/// A value for a Stripe search query string literal.
fn search_literal(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

impl CardProcessor for ProcessorClient {
    async fn create_charge(&self, request: &FrozenRequest) -> Result<Charge, ProcessorError> {
        tracing::debug!(key = %request.key, source = %request.field("source").map(mask_token).unwrap_or_default(), "creating a charge");
        self.call(Method::POST, &request.path, Some(&request.form), Some(&request.key)).await
    }

    async fn capture_charge(&self, request: &FrozenRequest) -> Result<Charge, ProcessorError> {
        self.call(Method::POST, &request.path, Some(&request.form), Some(&request.key)).await
    }

    async fn create_refund(&self, request: &FrozenRequest) -> Result<Refund, ProcessorError> {
        self.call(Method::POST, &request.path, Some(&request.form), Some(&request.key)).await
    }

    async fn retrieve_charge(&self, charge_id: &str) -> Result<Charge, ProcessorError> {
        self.call(Method::GET, &format!("/v1/charges/{charge_id}"), None, None).await
    }

    async fn search_charges(&self, payment_id: &str) -> Result<Vec<Charge>, ProcessorError> {
        let query = format!("metadata['payment_id']:'{}'", search_literal(payment_id));
        let mut found = Vec::new();
        let mut page: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = vec![("query", query.as_str()), ("limit", "100")];
            if let Some(page) = &page {
                params.push(("page", page));
            }
            let encoded = serde_urlencoded::to_string(&params)
                .map_err(|err| unknown(format!("cannot encode a search: {err}")))?;
            let result: SearchPage<Charge> = self
                .call(Method::GET, &format!("/v1/charges/search?{encoded}"), None, None)
                .await?;
            found.extend(result.data);
            match result.next_page {
                Some(next) if result.has_more => page = Some(next),
                _ => return Ok(found),
            }
        }
        Err(unknown(format!("the search for {payment_id} has more than {MAX_PAGES} pages")))
    }

    async fn list_refunds(&self, charge_id: &str) -> Result<Vec<Refund>, ProcessorError> {
        let mut found: Vec<Refund> = Vec::new();
        for _ in 0..MAX_PAGES {
            let mut params = vec![("charge", charge_id), ("limit", "100")];
            if let Some(last) = found.last() {
                params.push(("starting_after", &last.id));
            }
            let encoded = serde_urlencoded::to_string(&params)
                .map_err(|err| unknown(format!("cannot encode a list: {err}")))?;
            let result: ListPage<Refund> =
                self.call(Method::GET, &format!("/v1/refunds?{encoded}"), None, None).await?;
            let more = result.has_more && !result.data.is_empty();
            found.extend(result.data);
            if !more {
                return Ok(found);
            }
        }
        Err(unknown(format!("the refunds of {charge_id} fill more than {MAX_PAGES} pages")))
    }

    fn search_lag(&self) -> Duration {
        self.config.search_lag
    }

    fn longest_call(&self) -> Duration {
        self.config.longest_call()
    }
}
