//! Exponential back-off with jitter: the one delay schedule of every retry loop (the processor
//! client, the typed API client, the worker's jobs and webhook deliveries).
//!
//! A leaf crate that knows nothing of payments, so `provider` and `payments-client` can use it
//! and still depend on nothing of ours in spirit. Why not the `backon` crate: its schedule is an
//! iterator that must be walked from the first retry, while the worker's loops resume from a
//! count stored in the database (`jobs.attempts`, a delivery's attempts) after a restart; and its
//! jitter adds up to one delay on top (d to 2d), where the clients want full jitter (0 to d, the
//! widest spread for the same mean wait) and deliveries the upper half (d/2 to d). The loops
//! decide themselves which answers retry and how `Retry-After` counts; only the delay is shared.

use std::time::Duration;

use rand::Rng as _;

/// How the delay is drawn below the exponential ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Exactly the ceiling: for a schedule a person reads back, or a single retrier.
    None,
    /// Uniform between zero and the ceiling: many clients that failed together spread out.
    Full,
    /// Uniform between half the ceiling and the ceiling: spread out, never much sooner than
    /// the schedule says.
    UpperHalf,
}

/// base × 2^(retry − 1), at most `cap`, drawn as `jitter` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first retry.
    pub base: Duration,
    /// The largest ceiling; the doubling stops there.
    pub cap: Duration,
    /// How the delay is drawn below the ceiling.
    pub jitter: Jitter,
}

impl Backoff {
    /// A schedule from `base` doubling up to `cap`.
    pub const fn new(base: Duration, cap: Duration, jitter: Jitter) -> Self {
        Self { base, cap, jitter }
    }

    /// The ceiling before retry `retry` (1 for the first): base × 2^(retry − 1), at most `cap`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.base.saturating_mul(1 << doublings).min(self.cap)
    }

    /// The delay before retry `retry` (1 for the first).
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry);
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        let drawn = match self.jitter {
            Jitter::None => return ceiling,
            Jitter::Full => rand::thread_rng().gen_range(0..=micros),
            Jitter::UpperHalf => rand::thread_rng().gen_range(micros.div_ceil(2)..=micros),
        };
        Duration::from_micros(drawn)
    }

    /// The delay before retry `retry`, but never sooner than the server asked (`Retry-After`),
    /// as far as `asked_cap`: a server that asks for an hour does not stall a caller that long.
    pub fn delay_honouring(
        &self,
        retry: u32,
        retry_after: Option<Duration>,
        asked_cap: Duration,
    ) -> Duration {
        let delay = self.delay(retry);
        retry_after.map_or(delay, |asked| delay.max(asked.min(asked_cap)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ceiling_doubles_from_the_base_and_stops_at_the_cap() {
        let backoff = Backoff::new(10 * MS, 70 * MS, Jitter::None);
        let ceilings: Vec<Duration> = (0..=6).map(|retry| backoff.ceiling(retry)).collect();
        assert_eq!(ceilings, [10 * MS, 10 * MS, 20 * MS, 40 * MS, 70 * MS, 70 * MS, 70 * MS]);
        assert_eq!(backoff.ceiling(u32::MAX), 70 * MS, "no overflow however late the retry");
    }

    #[test]
    fn without_jitter_the_delay_is_the_ceiling() {
        let backoff = Backoff::new(MS, Duration::MAX, Jitter::None);
        assert_eq!(backoff.delay(4), 8 * MS);
        assert_eq!(backoff.delay(200), MS.saturating_mul(1 << 31));
    }

    #[test]
    fn jitter_draws_within_its_range_and_spreads() {
        let full = Backoff::new(100 * MS, Duration::MAX, Jitter::Full);
        let half = Backoff::new(100 * MS, Duration::MAX, Jitter::UpperHalf);
        let fulls: Vec<Duration> = (0..200).map(|_| full.delay(2)).collect();
        let halves: Vec<Duration> = (0..200).map(|_| half.delay(2)).collect();
        assert!(fulls.iter().all(|d| *d <= 200 * MS));
        assert!(halves.iter().all(|d| (100 * MS..=200 * MS).contains(d)));
        // 200 draws from a range of 200 000 microseconds: all equal only if nothing is drawn.
        assert!(fulls.iter().any(|d| *d != fulls[0]) && halves.iter().any(|d| *d != halves[0]));
        assert!(fulls.iter().any(|d| *d < 100 * MS), "full jitter reaches below the upper half");
    }

    #[test]
    fn retry_after_is_a_floor_up_to_its_cap() {
        let backoff = Backoff::new(MS, 5 * MS, Jitter::Full);
        let asked = Some(Duration::from_secs(2));
        assert_eq!(backoff.delay_honouring(1, asked, Duration::from_secs(10)), 2000 * MS);
        assert_eq!(backoff.delay_honouring(1, asked, 30 * MS), 30 * MS);
        assert!(backoff.delay_honouring(1, None, 30 * MS) <= MS);
    }
}
