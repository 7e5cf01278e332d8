//! Places in flight: the server's (`http.max_in_flight_requests`), which the edge takes for each
//! request ([`InFlight`]), and each account's share of them (`rate_limit.account_in_flight`,
//! [`AccountsInFlight`]), taken once the caller is known. A body is read outside both
//! ([`InFlight::read_outside`]), under a total deadline, so that bodies that trickle in hold no
//! place: otherwise one caller sending a few slow bodies a second could hold every place, and
//! every other tenant would be answered `503`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use payments_domain::AccountId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, ProblemCode};

/// A request's places in flight, in its extensions: the server's, which the edge takes before
/// anything else runs, and its account's, which authentication adds. Both are given back when the
/// answer is ready; a body is read without them ([`InFlight::read_outside`]).
#[derive(Debug, Clone)]
pub struct InFlight {
    places: Arc<Semaphore>,
    body_deadline: Duration,
    held: Arc<Mutex<Held>>,
}

#[derive(Debug, Default)]
struct Held {
    /// The server's place, while held.
    place: Option<OwnedSemaphorePermit>,
    /// The account's place, once the caller is known.
    account: Option<AccountPlace>,
}

impl InFlight {
    /// A place of `places`, or the `503` that sheds the request when none is left; bodies read
    /// outside it take at most `body_deadline`.
    pub fn take(places: Arc<Semaphore>, body_deadline: Duration) -> Result<Self, ApiError> {
        let permit = places.clone().try_acquire_owned().map_err(|_| shed())?;
        let held = Held { place: Some(permit), account: None };
        Ok(Self { places, body_deadline, held: Arc::new(Mutex::new(held)) })
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the account's place, held until the answer is ready.
    pub fn hold_account(&self, place: AccountPlace) {
        self.held().account = Some(place);
    }

    /// Runs `read` (a body's) without the server's place and the account's, within the body
    /// deadline, then takes them again: none left is the `503` of the edge or the `429` of the
    /// account's share. A body that is late is a `400`, as one whose pieces stall.
    pub async fn read_outside<T>(
        &self,
        read: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        // Both given back now, for as long as the body takes: only the account is kept.
        let account = {
            let mut held = self.held();
            held.place = None;
            held.account.take().map(AccountPlace::leave)
        };
        let read = tokio::time::timeout(self.body_deadline, read).await.map_err(|_| {
            ApiError::invalid_request(
                "body",
                format!(
                    "The request body did not arrive within {} ms.",
                    self.body_deadline.as_millis()
                ),
            )
        })??;
        let place = self.places.clone().try_acquire_owned().map_err(|_| shed())?;
        let account = account.map(|(accounts, account)| accounts.enter(&account)).transpose()?;
        let mut held = self.held();
        held.place = Some(place);
        held.account = account;
        Ok(read)
    }

    /// Gives every place back: the request no longer counts against the bounds.
    pub fn give_back(&self) {
        let mut held = self.held();
        held.place = None;
        held.account = None;
    }
}

/// The answer to a request beyond the server's bound.
fn shed() -> ApiError {
    metrics::counter!("requests_shed_total").increment(1);
    ApiError::new(
        ProblemCode::ServiceUnavailable,
        "The server is serving as many requests as it can. Retry after the number of seconds in Retry-After.",
    )
}

/// How many requests each account has in flight, and how many it may (`0`: no bound).
#[derive(Debug, Default)]
pub struct AccountsInFlight {
    cap: u32,
    counts: Mutex<HashMap<AccountId, u32>>,
}

impl AccountsInFlight {
    /// At most `cap` requests in flight per account; `0` bounds nothing.
    pub fn new(cap: u32) -> Arc<Self> {
        Arc::new(Self { cap, counts: Mutex::default() })
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<AccountId, u32>> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for one more request of `account`, or `429` with `Retry-After` when it has as
    /// many in flight as it may.
    pub fn enter(self: &Arc<Self>, account: &AccountId) -> Result<AccountPlace, ApiError> {
        if self.cap > 0 {
            let mut counts = self.counts();
            let count = counts.entry(account.clone()).or_default();
            if *count >= self.cap {
                metrics::counter!("rate_limited_total", "reason" => "in_flight").increment(1);
                return Err(ApiError::new(
                    ProblemCode::RateLimited,
                    "This account has as many requests in flight as it may. Retry after the number of seconds in Retry-After, with the same Idempotency-Key.",
                )
                .with_retry_after(1));
            }
            *count += 1;
        }
        Ok(AccountPlace { accounts: self.clone(), account: account.clone() })
    }

    /// Requests of `account` in flight.
    pub fn count(&self, account: &AccountId) -> u32 {
        self.counts().get(account).copied().unwrap_or(0)
    }
}

/// One request's place in its account's share; given back when dropped.
#[derive(Debug)]
pub struct AccountPlace {
    accounts: Arc<AccountsInFlight>,
    account: AccountId,
}

impl AccountPlace {
    /// Gives the place back, keeping what takes it again ([`AccountsInFlight::enter`]).
    fn leave(self) -> (Arc<AccountsInFlight>, AccountId) {
        (self.accounts.clone(), self.account.clone())
    }
}

impl Drop for AccountPlace {
    fn drop(&mut self) {
        if self.accounts.cap == 0 {
            return;
        }
        let mut counts = self.accounts.counts();
        if let Some(count) = counts.get_mut(&self.account) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.account);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic in a test is a failed test
mod tests {
    use axum::response::IntoResponse;

    use super::*;

    #[test]
    fn an_account_holds_at_most_its_share_and_gets_it_back_as_requests_end() {
        let accounts = AccountsInFlight::new(2);
        let (shop, other) =
            (AccountId::parse("acct_shop").unwrap(), AccountId::parse("acct_other").unwrap());
        let first = accounts.enter(&shop).unwrap();
        let _second = accounts.enter(&shop).unwrap();
        let refused = accounts.enter(&shop).unwrap_err().into_response();
        assert_eq!(refused.status().as_u16(), 429);
        assert!(accounts.enter(&other).is_ok(), "another account has its own share");
        drop(first);
        assert_eq!(accounts.count(&shop), 1);
        assert!(accounts.enter(&shop).is_ok());
    }

    #[tokio::test]
    async fn a_body_is_read_holding_neither_the_servers_place_nor_the_accounts() {
        let (places, accounts) = (Arc::new(Semaphore::new(1)), AccountsInFlight::new(1));
        let shop = AccountId::parse("acct_shop").unwrap();
        let in_flight = InFlight::take(places.clone(), Duration::from_secs(5)).unwrap();
        in_flight.hold_account(accounts.enter(&shop).unwrap());
        let read = in_flight.read_outside(async {
            assert_eq!(places.available_permits(), 1, "the server's place is free");
            assert_eq!(accounts.count(&shop), 0, "the account's place is free");
            Ok(())
        });
        read.await.unwrap();
        assert_eq!((places.available_permits(), accounts.count(&shop)), (0, 1), "taken again");
        in_flight.give_back();
        assert_eq!((places.available_permits(), accounts.count(&shop)), (1, 0));
    }

    #[test]
    fn no_cap_bounds_nothing() {
        let accounts = AccountsInFlight::new(0);
        let shop = AccountId::parse("acct_shop").unwrap();
        let places: Vec<_> = (0..1000).map(|_| accounts.enter(&shop).unwrap()).collect();
        assert_eq!(places.len(), 1000);
    }
}
