//! Seeded fault injection: the same seed and the same sequence of requests give the same faults.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The faults in force. Rates are probabilities from 0 to 1, drawn per request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Seed of the generator that draws the faults.
    pub seed: u64,
    /// Added to every request.
    pub latency_ms: u64,
    /// A uniform extra delay from 0 to this.
    pub jitter_ms: u64,
    /// Share answered 500 without acting.
    pub error_rate: f64,
    /// Share answered 429 without acting.
    pub rate_limit_rate: f64,
    /// Share acted on, then answered with a broken connection.
    pub lost_response_rate: f64,
    /// Share answered with a broken connection without acting.
    pub drop_rate: f64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            latency_ms: 0,
            jitter_ms: 0,
            error_rate: 0.0,
            rate_limit_rate: 0.0,
            lost_response_rate: 0.0,
            drop_rate: 0.0,
        }
    }
}

impl FaultConfig {
    /// Checks the rates and delays.
    pub fn validate(&self) -> Result<(), String> {
        for (name, rate) in [
            ("error_rate", self.error_rate),
            ("rate_limit_rate", self.rate_limit_rate),
            ("lost_response_rate", self.lost_response_rate),
            ("drop_rate", self.drop_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1"));
            }
        }
        let longest = Duration::from_millis(self.latency_ms.saturating_add(self.jitter_ms));
        if longest > super::MAX_LATENCY {
            return Err(format!(
                "latency_ms + jitter_ms must be at most {} ms",
                super::MAX_LATENCY.as_millis()
            ));
        }
        Ok(())
    }
}

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    None,
    Drop,
    ServerError,
    RateLimit,
    LostResponse,
}

#[derive(Debug)]
pub(super) struct Injector {
    config: FaultConfig,
    rng: StdRng,
}

impl Injector {
    pub(super) fn new(config: FaultConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        Self { config, rng }
    }

    pub(super) fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// Draws this request's fault and delay. Every request draws the same number of values, so
    /// the sequence depends only on the seed and the order of requests.
    pub(super) fn plan(&mut self) -> (Fault, Duration) {
        let draws: [f64; 4] =
            [self.rng.r#gen(), self.rng.r#gen(), self.rng.r#gen(), self.rng.r#gen()];
        let jitter = if self.config.jitter_ms > 0 {
            self.rng.gen_range(0..=self.config.jitter_ms)
        } else {
            0
        };
        let delay = Duration::from_millis(self.config.latency_ms + jitter);
        let fault = if draws[0] < self.config.drop_rate {
            Fault::Drop
        } else if draws[1] < self.config.error_rate {
            Fault::ServerError
        } else if draws[2] < self.config.rate_limit_rate {
            Fault::RateLimit
        } else if draws[3] < self.config.lost_response_rate {
            Fault::LostResponse
        } else {
            Fault::None
        };
        (fault, delay)
    }
}
