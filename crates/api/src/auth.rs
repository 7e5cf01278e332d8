//! Authentication: `Authorization: Bearer sk_test_…`, or HTTP Basic with the key as the user name.
//!
//! A request without usable credentials is `401 authentication_required`; one whose key is unknown
//! or revoked is `401 invalid_api_key`. A key that does not even look like one of ours is refused
//! without a database round trip.
//!
//! Idempotent endpoints take a `Caller`, whose key may be checked by the claim itself rather than
//! by a lookup of its own; everything else takes `Authenticated`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, PoisonError, RwLock};

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use governor::Quota;
use governor::clock::DefaultClock;
use payments_domain::AccountId;
use payments_domain::accounts::{self, SECRET_KEY_PREFIX};

use crate::app::AppState;
use crate::error::{ApiError, ProblemCode};

/// Request rates, per account.
pub type AccountLimiter = governor::DefaultKeyedRateLimiter<AccountId>;

/// The limiter the settings describe, or `None` when the limit is off.
pub fn rate_limiter(
    settings: &payments_settings::RateLimitSettings,
) -> Option<Arc<AccountLimiter>> {
    let per_second = NonZeroU32::new(settings.per_second)?;
    let burst = NonZeroU32::new(settings.burst).unwrap_or(per_second);
    Some(Arc::new(governor::RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst))))
}

/// The account a request acts for, its key checked against the database by this request.
#[derive(Debug, Clone)]
pub struct Authenticated(pub AccountId);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = identify(parts, state, false).await?;
        Ok(Self(caller.account))
    }
}

/// The caller of an idempotent endpoint: the account its API key belongs to, and whether this
/// request has checked the key yet.
///
/// When the key was seen before, its account comes from `KnownKeys` and the check is left to the
/// claim, which makes it in the same statement (`ClaimRequest::credential`): a replay is then one
/// round trip. Authentication still answers first: anything refused before the claim checks the
/// key first (`admit`), so a revoked key gets `401` whatever else is wrong with the request.
#[derive(Debug, Clone)]
pub struct Caller {
    account: AccountId,
    digest: [u8; 32],
    checked: bool,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        identify(parts, state, true).await
    }
}

impl Caller {
    /// The account the key belongs to.
    pub fn account(&self) -> &AccountId {
        &self.account
    }

    /// What the claim must check: the key's digest, unless this request has checked it.
    pub fn credential(&self) -> Option<&[u8]> {
        (!self.checked).then_some(&self.digest[..])
    }

    /// `result`, once the key is known to be live: an error answered before the claim must not
    /// hide that the key is unknown or revoked.
    pub async fn admit<T>(
        &self,
        state: &AppState,
        result: Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        if result.is_err() {
            self.check(state).await?;
        }
        result
    }

    /// Records that the claim found the key dead.
    pub fn refused(&self, state: &AppState) {
        state.known_keys.forget(&self.digest);
    }

    /// Looks the key up, unless this request already has.
    async fn check(&self, state: &AppState) -> Result<(), ApiError> {
        if self.checked {
            return Ok(());
        }
        match accounts::authenticate_digest(&state.pool, &self.digest).await? {
            Some(account) if account == self.account => Ok(()),
            _ => {
                self.refused(state);
                Err(invalid_api_key())
            }
        }
    }
}

/// Which account each API key seen lately belongs to. A key never changes accounts, so an entry
/// can only be out of date by the key having been revoked, and every use of an entry is checked
/// for that (`Caller`). Bounded: when full, it starts again empty.
#[derive(Debug, Default)]
pub struct KnownKeys(RwLock<HashMap<[u8; 32], AccountId>>);

impl KnownKeys {
    const CAPACITY: usize = 10_000;

    fn account(&self, digest: &[u8; 32]) -> Option<AccountId> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).get(digest).cloned()
    }

    fn learn(&self, digest: [u8; 32], account: AccountId) {
        let mut known = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= Self::CAPACITY {
            known.clear();
        }
        known.insert(digest, account);
    }

    fn forget(&self, digest: &[u8; 32]) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).remove(digest);
    }
}

/// Who the request says it is, and its rate limit. With `trust_known`, a key seen before is not
/// looked up again (the caller's claim checks it); otherwise it is looked up now.
async fn identify(parts: &Parts, state: &AppState, trust_known: bool) -> Result<Caller, ApiError> {
    let presented = presented_key(parts)?;
    if !presented.starts_with(SECRET_KEY_PREFIX) {
        return Err(invalid_api_key());
    }
    let digest = accounts::key_digest(&presented);
    let known = if trust_known { state.known_keys.account(&digest) } else { None };
    let caller = match known {
        Some(account) => Caller { account, digest, checked: false },
        None => {
            let account = accounts::authenticate_digest(&state.pool, &digest)
                .await?
                .ok_or_else(invalid_api_key)?;
            state.known_keys.learn(digest, account.clone());
            Caller { account, digest, checked: true }
        }
    };
    tracing::Span::current().record("account_id", caller.account.as_str());
    if let Err(limited) = rate_limit(state, &caller.account) {
        caller.check(state).await?;
        return Err(limited);
    }
    Ok(caller)
}

/// `429` when the account is over its rate.
fn rate_limit(state: &AppState, account: &AccountId) -> Result<(), ApiError> {
    let Some(limiter) = &state.rate_limiter else { return Ok(()) };
    if limiter.len() > 100_000 {
        // Forget accounts that have been quiet long enough to have their full burst again.
        limiter.retain_recent();
    }
    let Err(not_until) = limiter.check_key(account) else { return Ok(()) };
    let wait = not_until.wait_time_from(governor::clock::Clock::now(&DefaultClock::default()));
    metrics::counter!("rate_limited_total").increment(1);
    let seconds =
        u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).unwrap_or(u32::MAX);
    Err(ApiError::new(
        ProblemCode::RateLimited,
        "This account is sending requests faster than its rate limit. Retry after the number of seconds in Retry-After, with the same Idempotency-Key.",
    )
    .with_retry_after(seconds))
}

/// `401 invalid_api_key`.
pub(crate) fn invalid_api_key() -> ApiError {
    ApiError::new(ProblemCode::InvalidApiKey, "The API key is unknown or has been revoked.")
}

/// The key the request presents, or why there is none.
fn presented_key(parts: &Parts) -> Result<String, ApiError> {
    let mut values = parts.headers.get_all(header::AUTHORIZATION).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => {
            return Err(ApiError::authentication_required(
                "No API key provided. Send `Authorization: Bearer sk_test_…`.",
            ));
        }
        (Some(_), Some(_)) => return Err(malformed("more than one Authorization header")),
        (Some(value), None) => value.to_str().map_err(|_| malformed("not visible ASCII"))?,
    };
    let (scheme, credentials) =
        value.trim().split_once(' ').ok_or_else(|| malformed("no scheme"))?;
    let credentials = credentials.trim();
    let key = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = STANDARD
            .decode(credentials)
            .map_err(|_| malformed("Basic credentials are not base64"))?;
        let decoded =
            String::from_utf8(decoded).map_err(|_| malformed("Basic credentials are not UTF-8"))?;
        // The key is the user name; like Stripe, the password is ignored.
        match decoded.split_once(':') {
            Some((user, _password)) => user.to_owned(),
            None => decoded,
        }
    } else {
        return Err(malformed("the scheme is neither Bearer nor Basic"));
    };
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(malformed("the key is empty or has invalid characters"));
    }
    Ok(key)
}

fn malformed(why: &str) -> ApiError {
    ApiError::authentication_required(format!(
        "The Authorization header is malformed ({why}). Send `Authorization: Bearer sk_test_…`."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(authorization: &[&str]) -> Parts {
        let mut builder = Request::builder();
        for value in authorization {
            builder = builder.header(header::AUTHORIZATION, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn code(result: Result<String, ApiError>) -> &'static str {
        result.unwrap_err().code().as_str()
    }

    #[test]
    fn bearer_and_basic_yield_the_same_key() {
        assert_eq!(presented_key(&parts(&["Bearer sk_test_abc"])).unwrap(), "sk_test_abc");
        assert_eq!(presented_key(&parts(&["bearer  sk_test_abc "])).unwrap(), "sk_test_abc");
        let basic = format!("Basic {}", STANDARD.encode("sk_test_abc:"));
        assert_eq!(presented_key(&parts(&[&basic])).unwrap(), "sk_test_abc");
        let no_colon = format!("Basic {}", STANDARD.encode("sk_test_abc"));
        assert_eq!(presented_key(&parts(&[&no_colon])).unwrap(), "sk_test_abc");
    }

    #[test]
    fn missing_or_malformed_credentials_require_authentication() {
        assert_eq!(code(presented_key(&parts(&[]))), "authentication_required");
        assert_eq!(code(presented_key(&parts(&["Bearer"]))), "authentication_required");
        assert_eq!(code(presented_key(&parts(&["Bearer "]))), "authentication_required");
        assert_eq!(code(presented_key(&parts(&["Token sk_test_abc"]))), "authentication_required");
        assert_eq!(code(presented_key(&parts(&["Basic !!!"]))), "authentication_required");
        assert_eq!(
            code(presented_key(&parts(&["Bearer a", "Bearer b"]))),
            "authentication_required"
        );
        let empty_user = format!("Basic {}", STANDARD.encode(":secret"));
        assert_eq!(code(presented_key(&parts(&[&empty_user]))), "authentication_required");
    }
}
