//! When and how long the client waits before trying again: its [`RetryPolicy`], the answers that
//! say "try again", and the back-off between tries.

use std::time::Duration;

use payments_backoff::{Backoff, Jitter};
use reqwest::StatusCode;

use crate::Client;

/// How hard the client tries.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub max_attempts: u32,
    /// First back-off ceiling; doubles per retry.
    pub base: Duration,
    /// Largest back-off ceiling.
    pub cap: Duration,
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
            retry_after_cap: Duration::from_secs(30),
        }
    }
}

impl Client {
    /// Full jitter below an exponentially growing ceiling, never sooner than `Retry-After` (as
    /// far as `retry_after_cap`).
    pub(crate) fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        Backoff::new(self.policy.base, self.policy.cap, Jitter::Full).delay_honouring(
            attempt,
            retry_after,
            self.policy.retry_after_cap,
        )
    }
}

/// Whether an answer says "try again" rather than "this is the result".
pub(crate) fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}
