//! The stand-in's clock: milliseconds since it started, from the monotonic clock or from a
//! hand-driven clock (so that Rust tests cross a key's lifetime or the search lag without
//! sleeping), plus an offset that `POST /_sim/clock` moves forward at run time, so that a test
//! suite in any language can do the same over HTTP. The unix time it shows (`created`, the
//! `now` of `/_sim/clock`) is the real time it started at plus that same elapsed time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A clock that moves only when told to, for tests: [`super::Simulator::build_with_clock`] runs
/// the stand-in on it, and [`ManualClock::advance`] moves the stand-in's time (key lifetimes,
/// search lag, `created`) forward. Clones share one time.
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

/// What moves the stand-in's time on its own.
#[derive(Debug, Clone)]
enum Source {
    /// The operating system's monotonic clock, from the stand-in's start: a wall-clock change
    /// never revives or expires a key.
    Monotonic(Instant),
    /// A test's clock.
    Manual(ManualClock),
}

/// Where the stand-in reads its time: a source, and the offset `POST /_sim/clock` added.
#[derive(Debug, Clone)]
pub(super) struct Clock {
    source: Source,
    /// Milliseconds added over HTTP since start (or since the last full reset).
    offset_ms: u64,
    /// The real unix time, in milliseconds, when the stand-in started.
    started_unix_ms: u64,
}

/// Real unix time in milliseconds (0 if the system clock is before 1970).
fn real_unix_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

impl Clock {
    /// The monotonic clock, starting now.
    pub(super) fn monotonic() -> Self {
        Self::on(Source::Monotonic(Instant::now()))
    }

    /// A test's clock.
    pub(super) fn manual(clock: ManualClock) -> Self {
        Self::on(Source::Manual(clock))
    }

    fn on(source: Source) -> Self {
        Self { source, offset_ms: 0, started_unix_ms: real_unix_ms() }
    }

    /// Milliseconds since the stand-in started, as it sees them (the offset included).
    pub(super) fn now_ms(&self) -> u64 {
        let elapsed_ms = match &self.source {
            Source::Monotonic(started) => {
                u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
            }
            Source::Manual(clock) => clock.elapsed_ms.load(Ordering::SeqCst),
        };
        elapsed_ms.saturating_add(self.offset_ms)
    }

    /// The unix time in seconds as the stand-in sees it: its real start plus [`Clock::now_ms`].
    pub(super) fn unix_now_s(&self) -> u64 {
        self.started_unix_ms.saturating_add(self.now_ms()) / 1000
    }

    /// Moves the time forward by `by_ms`.
    pub(super) fn advance(&mut self, by_ms: u64) {
        self.offset_ms = self.offset_ms.saturating_add(by_ms);
    }

    /// Milliseconds added by [`Clock::advance`] so far.
    pub(super) fn offset_ms(&self) -> u64 {
        self.offset_ms
    }

    /// Takes back every [`Clock::advance`]: a full reset starts the time where the real clock
    /// is (a [`ManualClock`] keeps its own time, which its test moves).
    pub(super) fn clear_offset(&mut self) {
        self.offset_ms = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_moves_the_elapsed_time_and_the_unix_time_alike() {
        let manual = ManualClock::new();
        let mut clock = Clock::manual(manual.clone());
        let unix_before = clock.unix_now_s();
        manual.advance(Duration::from_millis(1500));
        clock.advance(3_600_000);
        assert_eq!(clock.now_ms(), 3_601_500);
        assert_eq!(clock.offset_ms(), 3_600_000);
        let moved = clock.unix_now_s() - unix_before;
        assert!((3601..=3602).contains(&moved), "{moved}");
        clock.clear_offset();
        assert_eq!(clock.now_ms(), 1500);
    }
}
