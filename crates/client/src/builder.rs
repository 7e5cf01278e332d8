//! How a [`Client`] is made ([`ClientBuilder`]): where it calls, with which key, how hard it
//! retries, and how long one request may take. Every request has a deadline: a connection that
//! never opens, or a server that accepts and never answers, ends the try instead of holding the
//! caller for ever.

use std::time::Duration;

use crate::{Client, Error, RetryPolicy};

/// The longest a connection may take to open, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one request may take, connection and answer included, by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Makes a [`Client`]: [`Client::builder`], the options, then [`build`](Self::build).
#[derive(Clone)]
pub struct ClientBuilder {
    base_url: String,
    secret: String,
    policy: RetryPolicy,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl ClientBuilder {
    pub(crate) fn new(base_url: &str, secret: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            secret: secret.to_owned(),
            policy: RetryPolicy::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// How hard the client tries (8 tries by default).
    pub fn retry_policy(self, policy: RetryPolicy) -> Self {
        Self { policy, ..self }
    }

    /// The longest a connection may take to open (5 s by default); past it the try failed and
    /// is retried.
    pub fn connect_timeout(self, connect_timeout: Duration) -> Self {
        Self { connect_timeout, ..self }
    }

    /// The longest one request may take, from connecting to the end of the answer (30 s by
    /// default); past it the try failed and is retried with the same key.
    pub fn request_timeout(self, request_timeout: Duration) -> Self {
        Self { request_timeout, ..self }
    }

    /// The client; fails only when its HTTP stack cannot be set up (its TLS backend).
    pub fn build(self) -> Result<Client, Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .build()
            .map_err(|err| Error::Setup(err.to_string()))?;
        Ok(Client::from_parts(http, self.base_url, self.secret, self.policy))
    }
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &self.base_url)
            .field("policy", &self.policy)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}
