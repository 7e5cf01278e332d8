//! The limits that keep one tenant from taking the server from the others: per account, a rate
//! and a share of the places in flight ([`InFlight`], [`AccountsInFlight`]); per client address,
//! the rate of lookups of API keys not known to be live, and of requests with no API key at all;
//! and in all, a ceiling on those lookups (`rate_limit.lookups_per_second`: a flood of bogus keys
//! from many addresses costs the database at most that many lookups a second).
//!
//! A client address is resolved once per request, at the edge ([`ClientAddress`], through
//! [`ProxyTrust`] when the peer is a trusted proxy), and counted as its [`SourceKey`]: an IPv4
//! address, or the /64 of an IPv6 one; the open connections of a source are bounded too
//! ([`SourceConnections`]).
//!
//! Memory is bounded with no work on the request path beyond the check itself. A key's entry is
//! indistinguishable from a fresh one once its bucket is full again, at most `(burst + 1) / rate`
//! seconds after its last admitted request (about 5 s per address and 2 s per account with the
//! defaults); a task of its own forgets such entries every [`PRUNE_PERIOD`] (`Limits::prune_every`),
//! so an entry outlives its last use by at most that window plus the period. The accounts' limiter
//! holds only accounts whose callers proved who they are. The addresses' limiter, which anyone
//! feeds, holds at most [`MAX_SOURCES`]: while it is full (until the next pruning) a lookup from
//! any address is answered `503` with `Retry-After`, as a server at its capacity is, and the
//! callers whose keys are known to be live, who need no lookup, are served as ever.

mod connections;
mod forwarded;
mod in_flight;
mod source;

use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::Duration;

use governor::Quota;
use governor::clock::{Clock, DefaultClock};
use payments_domain::AccountId;
use payments_settings::RateLimitSettings;

pub use connections::{SourceConnection, SourceConnections};
pub use forwarded::ProxyTrust;
pub use in_flight::{AccountPlace, AccountsInFlight, InFlight};
pub use source::{ClientAddress, SourceKey};

use crate::error::{ApiError, ProblemCode};

/// Request rates, per account.
pub type AccountLimiter = governor::DefaultKeyedRateLimiter<AccountId>;

/// Rates of lookups of keys not known to be live, per source.
pub type AddressLimiter = governor::DefaultKeyedRateLimiter<SourceKey>;

/// How often the limiters forget the keys whose buckets are full again.
pub const PRUNE_PERIOD: Duration = Duration::from_secs(10);

/// Sources the per-address limiter holds at most (a few megabytes).
pub const MAX_SOURCES: usize = 100_000;

/// The limits of one server, as the settings describe them.
#[derive(Debug, Default)]
pub struct Limits {
    /// Per account; `None` when off.
    accounts: Option<Arc<AccountLimiter>>,
    /// Per source, of lookups of keys not known to be live; `None` when off.
    addresses: Option<Arc<AddressLimiter>>,
    /// Sources `addresses` holds at most.
    max_sources: usize,
    /// Of all lookups of keys not known to be live; `None` when off.
    lookups: Option<governor::DefaultDirectRateLimiter>,
    /// Each account's requests in flight.
    in_flight: Arc<AccountsInFlight>,
    /// Per source, of requests that present no API key; `None` when off.
    anonymous: Option<Arc<AddressLimiter>>,
}

impl Limits {
    /// The limits `settings` describe.
    pub fn new(settings: &RateLimitSettings) -> Self {
        Self {
            accounts: keyed(settings.per_second, settings.burst),
            addresses: keyed(settings.per_address_per_second, settings.per_address_burst),
            max_sources: MAX_SOURCES,
            lookups: NonZeroU32::new(settings.lookups_per_second)
                .map(|per_second| governor::RateLimiter::direct(Quota::per_second(per_second))),
            in_flight: AccountsInFlight::new(settings.account_in_flight),
            anonymous: keyed(settings.anonymous_per_second, settings.anonymous_burst),
        }
    }

    /// Forgets, every `period`, the keys whose buckets are full again, on a task of its own that
    /// ends once these limits are dropped (the server stopped). `None` when no limit is on.
    pub fn prune_every(&self, period: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let accounts = self.accounts.as_ref().map(Arc::downgrade);
        let addresses = self.addresses.as_ref().map(Arc::downgrade);
        let anonymous = self.anonymous.as_ref().map(Arc::downgrade);
        if accounts.is_none() && addresses.is_none() && anonymous.is_none() {
            return None;
        }
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is at once, with nothing to forget yet.
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let pruned_accounts = prune(accounts.as_ref());
                let pruned_addresses = prune(addresses.as_ref());
                let pruned_anonymous = prune(anonymous.as_ref());
                if !(pruned_accounts || pruned_addresses || pruned_anonymous) {
                    break;
                }
            }
        }))
    }

    /// `429` when the account is over its rate.
    pub fn account(&self, account: &AccountId) -> Result<(), ApiError> {
        let Some(limiter) = &self.accounts else { return Ok(()) };
        let Err(not_until) = limiter.check_key(account) else { return Ok(()) };
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        metrics::counter!("rate_limited_total", "reason" => "rate").increment(1);
        Err(ApiError::new(
            ProblemCode::RateLimited,
            "This account is sending requests faster than its rate limit. Retry after the number of seconds in Retry-After, with the same Idempotency-Key.",
        )
        .with_retry_after(whole_seconds(wait)))
    }

    /// `429` when `client` has sent too many requests without an API key (to the routes that
    /// need none: health, the OpenAPI document, the problem pages, the inspector's login). A
    /// request with no client address (a test's `oneshot`) has no limit.
    pub fn anonymous(&self, client: Option<&ClientAddress>) -> Result<(), ApiError> {
        let (Some(limiter), Some(client)) = (&self.anonymous, client) else { return Ok(()) };
        let Err(not_until) = limiter.check_key(&client.source()) else { return Ok(()) };
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        metrics::counter!("rate_limited_addresses_total", "reason" => "anonymous").increment(1);
        Err(ApiError::new(
            ProblemCode::RateLimited,
            "This address is sending requests without an API key faster than allowed. Retry after the number of seconds in Retry-After.",
        )
        .with_retry_after(whole_seconds(wait)))
    }

    /// A place among `account`'s requests in flight, or `429` when it has as many as it may.
    pub fn enter(&self, account: &AccountId) -> Result<AccountPlace, ApiError> {
        self.in_flight.enter(account)
    }

    /// Counts a lookup of a key not known to be live: `429` when `client` has asked for too many,
    /// `503` when the server has made as many as it makes in a second or its per-address limiter
    /// holds as many sources as it may. The client is counted first, so that one flooding address
    /// spends its own allowance and not everyone's. A request with no client address (a test's
    /// `oneshot`) has no limit of its own.
    pub fn lookup(&self, client: Option<&ClientAddress>) -> Result<(), ApiError> {
        if let (Some(limiter), Some(client)) = (&self.addresses, client) {
            self.limit_source(limiter, client)?;
        }
        let Some(ceiling) = &self.lookups else { return Ok(()) };
        let Err(not_until) = ceiling.check() else { return Ok(()) };
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        metrics::counter!("key_lookups_shed_total", "reason" => "ceiling").increment(1);
        Err(ApiError::new(
            ProblemCode::ServiceUnavailable,
            "The server is checking as many new API keys as it can. Retry after the number of seconds in Retry-After.",
        )
        .with_retry_after(whole_seconds(wait)))
    }

    /// The per-address part of `lookup`.
    fn limit_source(
        &self,
        limiter: &AddressLimiter,
        client: &ClientAddress,
    ) -> Result<(), ApiError> {
        if limiter.len() >= self.max_sources {
            metrics::counter!("key_lookups_shed_total", "reason" => "sources").increment(1);
            return Err(ApiError::new(
                ProblemCode::ServiceUnavailable,
                "The server is checking as many new API keys as it can. Retry after the number of seconds in Retry-After.",
            )
            .with_retry_after(whole_seconds(PRUNE_PERIOD)));
        }
        let Err(not_until) = limiter.check_key(&client.source()) else { return Ok(()) };
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        metrics::counter!("rate_limited_addresses_total", "reason" => "lookup").increment(1);
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

/// Forgets the keys of the limiter `weak` points to whose buckets are full again; `false` when
/// there is no such limiter (any more).
fn prune<K: std::hash::Hash + Eq + Clone>(
    weak: Option<&Weak<governor::DefaultKeyedRateLimiter<K>>>,
) -> bool {
    let Some(limiter) = weak.and_then(Weak::upgrade) else { return false };
    limiter.retain_recent();
    limiter.shrink_to_fit();
    true
}

fn whole_seconds(wait: Duration) -> u32 {
    u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test
mod tests {
    use super::*;

    /// Limits whose buckets are full again a millisecond after their last use.
    fn brief(max_sources: usize) -> Limits {
        let quota = Quota::per_second(NonZeroU32::new(1000).unwrap());
        Limits {
            accounts: Some(Arc::new(governor::RateLimiter::keyed(quota))),
            addresses: Some(Arc::new(governor::RateLimiter::keyed(quota))),
            max_sources,
            lookups: None,
            in_flight: AccountsInFlight::new(0),
            anonymous: None,
        }
    }

    fn client(address: &str) -> ClientAddress {
        ClientAddress::new(address.parse().unwrap())
    }

    #[tokio::test]
    async fn the_pruner_forgets_what_has_its_burst_again_and_ends_with_the_limits() {
        let limits = brief(MAX_SOURCES);
        for i in 0..100 {
            limits.lookup(Some(&client(&format!("192.0.2.{i}")))).unwrap();
            limits.account(&format!("acct_{i}").parse().unwrap()).unwrap();
        }
        let sources = || limits.addresses.as_ref().unwrap().len();
        let accounts = || limits.accounts.as_ref().unwrap().len();
        assert_eq!((sources(), accounts()), (100, 100));
        let pruner = limits.prune_every(Duration::from_millis(5)).unwrap();
        payments_testkit::eventually(
            "the pruner to forget them",
            Duration::from_secs(10),
            || async { (sources(), accounts()) == (0, 0) },
        )
        .await;
        drop(limits);
        tokio::time::timeout(Duration::from_secs(10), pruner)
            .await
            .expect("the pruner ends once the limits are gone")
            .unwrap();
    }

    #[tokio::test]
    async fn a_full_address_limiter_refuses_lookups_until_it_is_pruned() {
        let limits = brief(3);
        for i in 0..3 {
            limits.lookup(Some(&client(&format!("2001:db8:0:{i}::1")))).unwrap();
        }
        let refused = limits.lookup(Some(&client("2001:db8:0:9::1"))).unwrap_err();
        assert_eq!(refused.code(), ProblemCode::ServiceUnavailable);
        // A source it holds is refused too: the limiter cannot tell one from a new one without
        // taking it in.
        assert!(limits.lookup(Some(&client("2001:db8:0:1::2"))).is_err());
        // Callers whose keys are known to be live are served as ever.
        limits.account(&"acct_1".parse().unwrap()).unwrap();
        let pruner = limits.prune_every(Duration::from_millis(5)).unwrap();
        payments_testkit::eventually("a pruning to make room", Duration::from_secs(10), || async {
            limits.lookup(Some(&client("2001:db8:0:9::1"))).is_ok()
        })
        .await;
        pruner.abort();
    }
}
