//! The HTTP client ([`ProcessorClient`]): one try, and the bounded retries around it that reuse
//! the same downstream key, with a back-off that honours `Retry-After`, logs and metrics.

use std::time::Duration;

use payments_backoff::{Backoff, Jitter};
use reqwest::{Method, header};
use serde::de::DeserializeOwned;

use super::answer::{status_error, transport_error, unknown, unreadable_success};
use super::{ErrorClass, ProcessorConfig, ProcessorError};
use crate::keys::DownstreamKey;

/// The HTTP client.
#[derive(Debug, Clone)]
pub struct ProcessorClient {
    http: reqwest::Client,
    pub(super) config: ProcessorConfig,
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

    pub(super) async fn call<T: DeserializeOwned>(
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
        if let Some(version) = &self.config.stripe_version {
            request = request.header("Stripe-Version", version);
        }
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
            let parsed =
                serde_json::from_slice(&body).map_err(|err| unreadable_success(status, &err));
            return (parsed, retry_after);
        }
        (Err(status_error(status, &body, replayed)), retry_after)
    }
}

/// A path without ids or query, as a metric label.
fn metric_path(path: &str) -> &'static str {
    let path = path.split_once('?').map_or(path, |(path, _query)| path);
    let intent = path.strip_prefix("/v1/payment_intents/");
    match path {
        "/v1/refunds" => "/v1/refunds",
        "/v1/payment_intents" => "/v1/payment_intents",
        "/v1/payment_intents/search" => "/v1/payment_intents/search",
        _ if intent.is_some_and(|rest| rest.ends_with("/capture")) => {
            "/v1/payment_intents/{id}/capture"
        }
        _ if intent.is_some_and(|rest| rest.ends_with("/cancel")) => {
            "/v1/payment_intents/{id}/cancel"
        }
        _ if intent.is_some() => "/v1/payment_intents/{id}",
        // Never an id: a label per object would grow the metric without bound.
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::metric_path;

    #[test]
    fn metric_labels_name_the_call_without_ids_or_queries() {
        for (path, label) in [
            ("/v1/refunds", "/v1/refunds"),
            ("/v1/refunds?payment_intent=pi_1&limit=100", "/v1/refunds"),
            ("/v1/payment_intents", "/v1/payment_intents"),
            ("/v1/payment_intents/pi_1", "/v1/payment_intents/{id}"),
            ("/v1/payment_intents/pi_1/capture", "/v1/payment_intents/{id}/capture"),
            ("/v1/payment_intents/pi_1/cancel", "/v1/payment_intents/{id}/cancel"),
            ("/v1/payment_intents/search?query=x", "/v1/payment_intents/search"),
            ("/v1/payment_intents/search?query=x&page=p2", "/v1/payment_intents/search"),
            ("/v1/charges", "other"),
            ("/v1/charges/ch_1", "other"),
            ("/v1/customers/cus_1", "other"),
        ] {
            assert_eq!(metric_path(path), label, "{path}");
        }
    }
}
