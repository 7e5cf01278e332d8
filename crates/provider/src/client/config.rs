//! How the processor is reached ([`ProcessorConfig`]): its address, key and API version, the
//! limits of one call and of its retries, and how far its search may trail its writes.

use std::fmt;
use std::time::Duration;

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
    /// The API version sent as `Stripe-Version` on every request (e.g. `2026-10-28.endive`), so
    /// that the processor answers in the shape this client was written for whatever the
    /// account's default; `None` sends no header and takes the account's default.
    pub stripe_version: Option<String>,
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
            .field("stripe_version", &self.stripe_version)
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
