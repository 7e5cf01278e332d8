//! How many wrong operator tokens the inspector hears before it stops listening ([`Guesses`]).
//!
//! A source (an IPv4 address, an IPv6 /64: `limits::SourceKey`) may be wrong
//! [`FREE_FAILURES`]` - 1` times in a row; the next wrong credential locks it out for
//! [`FIRST_LOCK`], and each further one doubles the lock, up to [`LONGEST_LOCK`]. A locked source
//! is answered `429` with `Retry-After` before anything it presents is compared, so it learns
//! nothing, not even a right guess. The right credential forgets the source's failures. Beside
//! the sources, all of them together may be wrong [`GLOBAL_FAILURES`] times in a [`WINDOW`];
//! beyond that every credential waits for the window's end, so guesses spread over many
//! addresses are bounded as well. A flood of wrong guesses can keep operators waiting a minute at
//! a time; it cannot let anyone in.
//!
//! Memory is bounded: at most [`MAX_SOURCES`] sources are remembered; when full, those no longer
//! locked are forgotten, and a source that still finds no room is held to the global bound
//! alone. The clock is the caller's (`now`), so tests need no sleeps.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::limits::SourceKey;

/// Wrong credentials in a row a source may present before the first lock.
pub const FREE_FAILURES: u32 = 5;
/// The first lock; each further failure doubles it.
pub const FIRST_LOCK: Duration = Duration::from_secs(1);
/// The longest lock.
pub const LONGEST_LOCK: Duration = Duration::from_secs(15 * 60);
/// Wrong credentials from all sources together per [`WINDOW`].
pub const GLOBAL_FAILURES: u32 = 60;
/// The global bound's window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Sources remembered at most.
pub const MAX_SOURCES: usize = 10_000;

/// The inspector's count of wrong credentials, per source and in all.
#[derive(Debug, Default)]
pub struct Guesses {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    sources: HashMap<SourceKey, Source>,
    /// When the current global window began, and the failures in it.
    window: Option<(Instant, u32)>,
}

#[derive(Debug, Clone, Copy)]
struct Source {
    /// Wrong credentials in a row.
    failures: u32,
    /// Locked out until then.
    locked_until: Option<Instant>,
}

impl Guesses {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `source` (`None`: not known) may present a credential at `now`, or how long it
    /// must wait first.
    pub fn admit(&self, source: Option<SourceKey>, now: Instant) -> Result<(), Duration> {
        let state = self.state();
        if let Some((began, failures)) = state.window {
            let ends = began + WINDOW;
            if failures >= GLOBAL_FAILURES && now < ends {
                return Err(ends - now);
            }
        }
        let locked = source.and_then(|key| state.sources.get(&key)?.locked_until);
        match locked {
            Some(until) if now < until => Err(until - now),
            _ => Ok(()),
        }
    }

    /// A wrong credential from `source` at `now`.
    pub fn failed(&self, source: Option<SourceKey>, now: Instant) {
        let mut state = self.state();
        state.window = match state.window {
            Some((began, failures)) if now < began + WINDOW => Some((began, failures + 1)),
            _ => Some((now, 1)),
        };
        let Some(key) = source else { return };
        if !state.sources.contains_key(&key) && state.sources.len() >= MAX_SOURCES {
            state.sources.retain(|_, source| source.locked_until.is_some_and(|until| now < until));
            if state.sources.len() >= MAX_SOURCES {
                return;
            }
        }
        let source = state.sources.entry(key).or_insert(Source { failures: 0, locked_until: None });
        source.failures = source.failures.saturating_add(1);
        if let Some(beyond) = source.failures.checked_sub(FREE_FAILURES) {
            let lock = FIRST_LOCK.saturating_mul(1 << beyond.min(20)).min(LONGEST_LOCK);
            source.locked_until = Some(now + lock);
        }
    }

    /// The right credential from `source`: its failures are forgotten.
    pub fn succeeded(&self, source: Option<SourceKey>) {
        if let Some(key) = source {
            self.state().sources.remove(&key);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn source(address: &str) -> Option<SourceKey> {
        Some(SourceKey::of(address.parse().unwrap()))
    }

    #[test]
    fn a_source_is_locked_after_its_free_failures_for_a_doubling_while() {
        let (guesses, start, me) = (Guesses::default(), Instant::now(), source("192.0.2.1"));
        for _ in 1..FREE_FAILURES {
            assert_eq!(guesses.admit(me, start), Ok(()));
            guesses.failed(me, start);
        }
        assert_eq!(guesses.admit(me, start), Ok(()), "one more guess is free");
        guesses.failed(me, start);
        assert_eq!(guesses.admit(me, start), Err(FIRST_LOCK));
        assert_eq!(guesses.admit(source("192.0.2.2"), start), Ok(()), "another source is not");
        let later = start + FIRST_LOCK;
        assert_eq!(guesses.admit(me, later), Ok(()), "the lock ends");
        guesses.failed(me, later);
        assert_eq!(guesses.admit(me, later), Err(FIRST_LOCK * 2), "and doubles");
        let much_later = later + LONGEST_LOCK;
        for _ in 0..30 {
            guesses.failed(me, much_later);
        }
        assert_eq!(guesses.admit(me, much_later), Err(LONGEST_LOCK), "up to the longest lock");
    }

    #[test]
    fn the_right_credential_forgets_the_failures() {
        let (guesses, now, me) = (Guesses::default(), Instant::now(), source("2001:db8::1"));
        for _ in 1..FREE_FAILURES {
            guesses.failed(me, now);
        }
        guesses.succeeded(me);
        for _ in 1..FREE_FAILURES {
            guesses.failed(me, now);
        }
        assert_eq!(guesses.admit(me, now), Ok(()));
        // The same /64 is the same source.
        guesses.failed(source("2001:db8::2"), now);
        assert_eq!(guesses.admit(me, now), Err(FIRST_LOCK));
    }

    #[test]
    fn failures_from_many_sources_meet_the_global_bound_until_the_window_ends() {
        let (guesses, start) = (Guesses::default(), Instant::now());
        for n in 0..GLOBAL_FAILURES {
            let address = format!("198.51.100.{}", n % 250);
            assert_eq!(guesses.admit(source(&address), start), Ok(()));
            guesses.failed(source(&address), start);
        }
        let fresh = source("203.0.113.9");
        assert_eq!(guesses.admit(fresh, start + WINDOW / 2), Err(WINDOW / 2));
        assert_eq!(guesses.admit(None, start), Err(WINDOW));
        assert_eq!(guesses.admit(fresh, start + WINDOW), Ok(()), "a new window");
    }

    #[test]
    fn the_sources_remembered_are_bounded() {
        let (guesses, now) = (Guesses::default(), Instant::now());
        let key = |n: usize| Some(SourceKey::of(std::net::Ipv4Addr::from(n as u32).into()));
        for n in 0..MAX_SOURCES + 10 {
            guesses.failed(key(n), now + WINDOW * (n as u32));
        }
        assert!(guesses.state().sources.len() <= MAX_SOURCES);
    }
}
