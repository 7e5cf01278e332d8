//! `[processor]`: where the card processor answers, the API version its client speaks and how it
//! retries, the metadata every charge carries, and the processor's webhooks to us.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// `[processor]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSettings {
    /// Where the processor answers.
    pub base_url: String,
    /// The key presented to it. Never printed.
    pub api_key: SecretString,
    /// Limit for opening a connection.
    pub connect_timeout_ms: u64,
    /// Limit for one request.
    pub request_timeout_ms: u64,
    /// Retries after the first try.
    pub max_retries: u32,
    /// First back-off ceiling.
    pub backoff_base_ms: u64,
    /// Largest back-off ceiling.
    pub backoff_cap_ms: u64,
    /// Longest `Retry-After` honoured.
    pub retry_after_cap_ms: u64,
    /// How far the processor's search may trail its writes; a reconciliation trusts a search
    /// that finds nothing only once the call it looks for is older than this plus the longest
    /// call.
    pub search_lag_ms: u64,
    /// The processor's API version, sent as `Stripe-Version` on every request (a dated version,
    /// `YYYY-MM-DD` with an optional `.name`), so that answers keep the shape the client reads
    /// whatever the account's default; empty sends none (the account's default version).
    pub stripe_version: String,
    /// Further `metadata[…]` members sent with every new charge (a deployment's own tags).
    /// Frozen with each charge request: changing them never changes a request in flight.
    #[serde(default)]
    pub charge_metadata: BTreeMap<String, String>,
    /// The signing secret (`whsec_…`) of the processor's webhooks to `POST /webhooks/processor`;
    /// empty turns that endpoint off (it answers 404). Never printed.
    pub webhook_secret: SecretString,
    /// How far a webhook's signed timestamp may be from now, in seconds; an older one is a
    /// replay and is refused.
    pub webhook_tolerance_s: u64,
    /// Webhooks whose bodies are read and verified at once, outside
    /// `http.max_in_flight_requests` (their senders are not known yet); more are answered 503.
    /// A verified webhook counts toward `http.max_in_flight_requests` like any other request.
    pub webhook_max_unverified: u32,
    /// Where the processor's authentication page (3-D Secure) sends the customer back; empty:
    /// the API's `http.public_base_url`.
    #[serde(default)]
    pub return_url: String,
    /// How long after a payment came to `requires_action` the worker asks the processor what
    /// became of it, if no webhook told us first, and then how often.
    pub authentication_check_after_s: u64,
    /// How long a customer has to authenticate; then the worker cancels the payment at the
    /// processor (`canceled`, `abandoned`).
    pub authentication_expires_after_s: u64,
}

impl std::fmt::Debug for ProcessorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessorSettings")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl ProcessorSettings {
    /// Where authentication sends the customer back: `return_url`, or `public_base_url`'s root.
    pub fn return_url(&self, public_base_url: &str) -> String {
        match self.return_url.trim() {
            "" => format!("{}/", public_base_url.trim_end_matches('/')),
            url => url.to_owned(),
        }
    }

    /// `authentication_check_after_s`.
    pub fn authentication_check_after(&self) -> Duration {
        Duration::from_secs(self.authentication_check_after_s)
    }

    /// `authentication_expires_after_s`.
    pub fn authentication_expires_after(&self) -> Duration {
        Duration::from_secs(self.authentication_expires_after_s)
    }

    /// The client's configuration.
    pub fn client_config(&self) -> provider::ProcessorConfig {
        provider::ProcessorConfig {
            base_url: self.base_url.trim_end_matches('/').to_owned(),
            api_key: self.api_key.expose_secret().to_owned(),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            max_retries: self.max_retries,
            backoff_base: Duration::from_millis(self.backoff_base_ms),
            backoff_cap: Duration::from_millis(self.backoff_cap_ms),
            retry_after_cap: Duration::from_millis(self.retry_after_cap_ms),
            search_lag: Duration::from_millis(self.search_lag_ms),
            stripe_version: Some(self.stripe_version.trim())
                .filter(|version| !version.is_empty())
                .map(str::to_owned),
        }
    }
}
