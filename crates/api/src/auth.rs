//! Authentication: `Authorization: Bearer sk_test_…`, or HTTP Basic with the key as the user name.
//!
//! A request without usable credentials is `401 authentication_required`; one whose key is unknown
//! or revoked is `401 invalid_api_key`. A key that does not even look like one of ours is refused
//! without a database round trip.

use std::num::NonZeroU32;
use std::sync::Arc;

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
pub type AccountLimiter = governor::DefaultKeyedRateLimiter<String>;

/// The limiter the settings describe, or `None` when the limit is off.
pub fn rate_limiter(
    settings: &payments_settings::RateLimitSettings,
) -> Option<Arc<AccountLimiter>> {
    let per_second = NonZeroU32::new(settings.per_second)?;
    let burst = NonZeroU32::new(settings.burst).unwrap_or(per_second);
    Some(Arc::new(governor::RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst))))
}

/// The account a request acts for.
#[derive(Debug, Clone)]
pub struct Authenticated(pub AccountId);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let presented = presented_key(parts)?;
        if !presented.starts_with(SECRET_KEY_PREFIX) {
            return Err(invalid_api_key());
        }
        let account =
            accounts::authenticate(&state.pool, &presented).await?.ok_or_else(invalid_api_key)?;
        tracing::Span::current().record("account_id", account.as_str());
        if let Some(limiter) = &state.rate_limiter
            && limiter.len() > 100_000
        {
            // Forget accounts that have been quiet long enough to have their full burst again.
            limiter.retain_recent();
        }
        if let Some(limiter) = &state.rate_limiter
            && let Err(not_until) = limiter.check_key(&account.to_string())
        {
            let wait =
                not_until.wait_time_from(governor::clock::Clock::now(&DefaultClock::default()));
            metrics::counter!("rate_limited_total").increment(1);
            let seconds = u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
                .unwrap_or(u32::MAX);
            return Err(ApiError::new(
                ProblemCode::RateLimited,
                "This account is sending requests faster than its rate limit. Retry after the number of seconds in Retry-After, with the same Idempotency-Key.",
            )
            .with_retry_after(seconds));
        }
        Ok(Self(account))
    }
}

fn invalid_api_key() -> ApiError {
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
