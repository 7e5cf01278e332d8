//! Authentication: `Authorization: Bearer sk_test_…`, or HTTP Basic with the key as the user name.
//!
//! A request without usable credentials is `401 authentication_required`; one whose key is unknown
//! or revoked is `401 invalid_api_key`. A key that does not even look like one of ours is refused
//! without a database round trip, and so is, for a few seconds, a key just found unknown.
//!
//! Every lookup of a key not known to be live counts against a limit per client address
//! ([`crate::limits`]): a flood of bogus credentials meets `429` and costs no database round trip.
//! What needs no lookup (no key, a malformed one, one found unknown lately) is a `401` and is not
//! counted.
//!
//! Idempotent endpoints take a `Caller`, whose key may be checked by the claim itself rather than
//! by a lookup of its own; everything else takes `Authenticated`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use payments_domain::AccountId;
use payments_domain::accounts::{self, SECRET_KEY_PREFIX};

use crate::app::AppState;
use crate::error::{ApiError, ProblemCode};
use crate::limits::{ClientAddress, InFlight};

/// API keys found unknown lately, each until its entry expires. A key is random, so one that was
/// unknown a moment ago is not about to be created; a revoked key stays revoked. Bounded: when
/// full, expired entries go, and if that is not enough, all.
#[derive(Debug)]
pub struct UnknownKeys {
    ttl: Duration,
    keys: Mutex<HashMap<[u8; 32], Instant>>,
}

impl UnknownKeys {
    const CAPACITY: usize = 10_000;

    /// An empty cache whose entries last `ttl` (zero: nothing is remembered).
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, keys: Mutex::default() }
    }

    fn contains(&self, digest: &[u8; 32]) -> bool {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.get(digest).is_some_and(|until| *until > Instant::now())
    }

    fn insert(&self, digest: [u8; 32]) {
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.len() >= Self::CAPACITY {
            keys.retain(|_, until| *until > now);
            if keys.len() >= Self::CAPACITY {
                keys.clear();
            }
        }
        keys.insert(digest, now + self.ttl);
    }
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
/// claim, which makes it in the same statement (`idem::Request::credential`): a replay is then one
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
    let presented = presented_key(parts);
    let digest = match &presented {
        Ok(key) if key.starts_with(SECRET_KEY_PREFIX) => Some(accounts::key_digest(key)),
        _ => None,
    };
    let known = digest.and_then(|digest| state.known_keys.account(&digest));
    // What costs nothing is answered before the address's limit: no key, a malformed one, a key
    // found unknown lately. The limit is on lookups of keys not known to be live.
    presented?;
    let Some(digest) = digest else { return Err(invalid_api_key()) };
    let caller = match known.clone().filter(|_| trust_known) {
        Some(account) => Caller { account, digest, checked: false },
        None => {
            if state.unknown_keys.contains(&digest) {
                return Err(invalid_api_key());
            }
            if known.is_none() {
                state.limits.lookup(parts.extensions.get::<ClientAddress>())?;
            }
            let Some(account) = accounts::authenticate_digest(&state.pool, &digest).await? else {
                // Revoked since it was seen live, perhaps: a request that trusts the known keys
                // must not take it for live again (it would read a body the claim then refuses).
                state.known_keys.forget(&digest);
                state.unknown_keys.insert(digest);
                return Err(invalid_api_key());
            };
            state.known_keys.learn(digest, account.clone());
            Caller { account, digest, checked: true }
        }
    };
    tracing::Span::current().record("account_id", caller.account.as_str());
    if let Err(limited) = state.limits.account(&caller.account) {
        caller.check(state).await?;
        return Err(limited);
    }
    // Its share of the places in flight, held with the server's until the answer is ready.
    let place = match state.limits.enter(&caller.account) {
        Ok(place) => place,
        Err(limited) => {
            caller.check(state).await?;
            return Err(limited);
        }
    };
    if let Some(in_flight) = parts.extensions.get::<InFlight>() {
        in_flight.hold_account(place);
    }
    Ok(caller)
}

/// Counts a request that presents no API key against its address's limit for such requests
/// (`rate_limit.anonymous_per_second`): the routes that need no key (health, the OpenAPI document,
/// the problem pages, the inspector) cost little, but not nothing. The processor's signed webhooks
/// have a bound of their own (`processor.webhook_max_unverified`) and are not counted.
pub async fn limit_anonymous(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let anonymous = !request.headers().contains_key(header::AUTHORIZATION)
        && request.uri().path() != PROCESSOR_WEBHOOKS;
    let client = request.extensions().get::<ClientAddress>();
    if anonymous && let Err(limited) = state.limits.anonymous(client) {
        return limited.into_response();
    }
    next.run(request).await
}

/// The processor's webhooks' path (`routes::processor_webhooks`).
const PROCESSOR_WEBHOOKS: &str = "/webhooks/processor";

/// `401 invalid_api_key`.
pub(crate) fn invalid_api_key() -> ApiError {
    // RFC 9110 asks every 401 to say how to authenticate; RFC 6750 names the error.
    ApiError::new(ProblemCode::InvalidApiKey, "The API key is unknown or has been revoked.")
        .with_header(
            header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static(
                "Bearer realm=\"payments\", error=\"invalid_token\"",
            ),
        )
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
