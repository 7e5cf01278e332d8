//! The rate limits: per account, and, for lookups of API keys not known to be live, per client
//! address.
//!
//! A client address is resolved once per request, at the edge ([`ClientAddress`], through
//! [`ProxyTrust`] when the peer is a trusted proxy), and counted as its [`SourceKey`]: an IPv4
//! address, or the /64 of an IPv6 one.

mod forwarded;
mod source;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::Quota;
use governor::clock::{Clock, DefaultClock};
use payments_domain::AccountId;
use payments_settings::RateLimitSettings;

pub use forwarded::ProxyTrust;
pub use source::{ClientAddress, SourceKey};

use crate::error::{ApiError, ProblemCode};

/// Request rates, per account.
pub type AccountLimiter = governor::DefaultKeyedRateLimiter<AccountId>;

/// Rates of lookups of keys not known to be live, per source.
pub type AddressLimiter = governor::DefaultKeyedRateLimiter<SourceKey>;

/// The limits of one server, as the settings describe them.
#[derive(Debug, Default)]
pub struct Limits {
    /// Per account; `None` when off.
    accounts: Option<Arc<AccountLimiter>>,
    /// Per source, of lookups of keys not known to be live; `None` when off.
    addresses: Option<Arc<AddressLimiter>>,
}

impl Limits {
    /// The limits `settings` describe.
    pub fn new(settings: &RateLimitSettings) -> Self {
        Self {
            accounts: keyed(settings.per_second, settings.burst),
            addresses: keyed(settings.per_address_per_second, settings.per_address_burst),
        }
    }

    /// `429` when the account is over its rate.
    pub fn account(&self, account: &AccountId) -> Result<(), ApiError> {
        let Some(limiter) = &self.accounts else { return Ok(()) };
        if limiter.len() > 100_000 {
            // Forget accounts that have been quiet long enough to have their full burst again.
            limiter.retain_recent();
        }
        let Err(not_until) = limiter.check_key(account) else { return Ok(()) };
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        metrics::counter!("rate_limited_total").increment(1);
        Err(ApiError::new(
            ProblemCode::RateLimited,
            "This account is sending requests faster than its rate limit. Retry after the number of seconds in Retry-After, with the same Idempotency-Key.",
        )
        .with_retry_after(whole_seconds(wait)))
    }

    /// `429` when `client` has asked for too many lookups of keys not known to be live. A request
    /// with no client address (a test's `oneshot`) has no limit.
    pub fn lookup(&self, client: Option<&ClientAddress>) -> Result<(), ApiError> {
        let (Some(limiter), Some(client)) = (&self.addresses, client) else { return Ok(()) };
        if limiter.len() > 100_000 {
            limiter.retain_recent();
        }
        let Err(not_until) = limiter.check_key(&client.source()) else { return Ok(()) };
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        metrics::counter!("rate_limited_addresses_total").increment(1);
        Err(ApiError::new(
            ProblemCode::RateLimited,
            "This address is sending requests without a valid API key faster than allowed. Retry after the number of seconds in Retry-After.",
        )
        .with_retry_after(whole_seconds(wait)))
    }
}

/// A keyed limiter of `per_second` with bursts of `burst` (`per_second` if 0), or `None` when
/// `per_second` is 0.
fn keyed<K: std::hash::Hash + Eq + Clone>(
    per_second: u32,
    burst: u32,
) -> Option<Arc<governor::DefaultKeyedRateLimiter<K>>> {
    let per_second = NonZeroU32::new(per_second)?;
    let burst = NonZeroU32::new(burst).unwrap_or(per_second);
    Some(Arc::new(governor::RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst))))
}

fn whole_seconds(wait: Duration) -> u32 {
    u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).unwrap_or(u32::MAX)
}
