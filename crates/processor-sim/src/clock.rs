//! The stand-in's clock: milliseconds since it started, from the monotonic clock, or from a
//! hand-driven clock so that tests cross a key's lifetime or the search lag without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A clock that moves only when told to, for tests: [`super::Simulator::build_with_clock`] runs
/// the stand-in on it, and [`ManualClock::advance`] moves the stand-in's time (key lifetimes,
/// search lag) forward. Clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    /// Milliseconds since the clock was made.
    elapsed_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the time forward by `by` (whole milliseconds).
    pub fn advance(&self, by: Duration) {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.elapsed_ms.fetch_add(by_ms, Ordering::SeqCst);
    }
}

/// Where the stand-in reads its time.
#[derive(Debug, Clone)]
pub(super) enum Clock {
    /// The operating system's monotonic clock, from the stand-in's start: a wall-clock change
    /// never revives or expires a key.
    Monotonic(Instant),
    /// A test's clock.
    Manual(ManualClock),
}

impl Clock {
    /// Milliseconds since the stand-in started.
    pub(super) fn now_ms(&self) -> u64 {
        match self {
            Self::Monotonic(started) => {
                u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
            }
            Self::Manual(clock) => clock.elapsed_ms.load(Ordering::SeqCst),
        }
    }
}
