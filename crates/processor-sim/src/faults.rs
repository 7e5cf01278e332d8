//! The stand-in's settings document (`PUT/GET /_sim/faults`): seeded fault injection, where the
//! same seed and the same sequence of requests give the same faults, and the fidelity settings
//! (idempotency rule, key lifetime, search lag, authentication lifetime), and the faults of the webhooks it sends (delay,
//! duplicates, out of order).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::webhooks::DeliveryPlan;

/// How faithfully the stand-in keeps results against idempotency keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Idempotency {
    /// As Stripe does: the result of every request that began executing is kept against its key
    /// and replayed (2xx, 402, the 4xx an operation raises, and 500s). A request refused before
    /// it executed (no API key, a body that is not a form, a parameter that fails validation, an
    /// injected 429 or plain 500, a drop) keeps nothing, so a retry executes.
    #[default]
    Stripe,
    /// The stand-in's first rule: only successes (2xx) and declines (402) are kept; any other
    /// answer is forgotten, so a retry with the same key executes again.
    Lenient,
}

impl fmt::Display for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stripe => "stripe",
            Self::Lenient => "lenient",
        })
    }
}

/// The faults and fidelity settings in force. Rates are probabilities from 0 to 1, drawn per
/// request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Seed of the generator that draws the faults.
    pub seed: u64,
    /// Added to every request.
    pub latency_ms: u64,
    /// A uniform extra delay from 0 to this.
    pub jitter_ms: u64,
    /// Share answered 500 without acting (nothing is kept against the key).
    pub error_rate: f64,
    /// Share answered 429 without acting.
    pub rate_limit_rate: f64,
    /// Share acted on, then answered with a broken connection.
    pub lost_response_rate: f64,
    /// Share answered with a broken connection without acting.
    pub drop_rate: f64,
    /// Share acted on (the charge, capture or refund happens), then answered `500 api_error`.
    /// In `stripe` mode that 500 is what the key keeps and replays ever after; in `lenient` mode
    /// nothing is kept, so the real result is forgotten and a retry executes again. Among POSTs
    /// it touches only those that execute: a replay, an idempotency error or a refusal on the
    /// parameters is answered as usual. A read acts on nothing and is answered as usual.
    pub error_after_processing_rate: f64,
    /// Which results are kept against idempotency keys.
    pub idempotency: Idempotency,
    /// Seconds an idempotency record is kept; an older one is forgotten and the key executes
    /// again (Stripe keeps keys for 24 hours).
    pub key_ttl_s: u64,
    /// Milliseconds a new charge or PaymentIntent stays invisible to search (Stripe's search
    /// can trail writes by up to about a minute).
    pub search_lag_ms: u64,
    /// Milliseconds before the first attempt to deliver each webhook event.
    pub webhook_delay_ms: u64,
    /// Share of webhook events delivered twice.
    pub webhook_duplicate_rate: f64,
    /// Share of webhook events held back until the next event has been sent (out of order).
    pub webhook_reorder_rate: f64,
    /// Milliseconds before a failed webhook attempt is tried again; doubles per attempt.
    pub webhook_retry_base_ms: u64,
    /// Seconds a PaymentIntent waits in `requires_action` for the customer to authenticate;
    /// then the authentication fails by itself (`payment_intent.payment_failed`).
    pub authentication_ttl_s: u64,
}

/// Stripe's key lifetime: 24 hours.
pub const DEFAULT_KEY_TTL_S: u64 = 24 * 60 * 60;

/// How long an authentication waits for the customer unless told: an hour.
pub const DEFAULT_AUTHENTICATION_TTL_S: u64 = 60 * 60;

/// The longest search lag accepted, so a typo cannot hide every charge from a test for hours.
const MAX_SEARCH_LAG: Duration = Duration::from_secs(600);

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
            error_after_processing_rate: 0.0,
            idempotency: Idempotency::Stripe,
            key_ttl_s: DEFAULT_KEY_TTL_S,
            search_lag_ms: 0,
            webhook_delay_ms: 0,
            webhook_duplicate_rate: 0.0,
            webhook_reorder_rate: 0.0,
            webhook_retry_base_ms: 500,
            authentication_ttl_s: DEFAULT_AUTHENTICATION_TTL_S,
        }
    }
}

impl FaultConfig {
    /// Checks the rates, delays and lifetimes.
    pub fn validate(&self) -> Result<(), String> {
        for (name, rate) in [
            ("error_rate", self.error_rate),
            ("rate_limit_rate", self.rate_limit_rate),
            ("lost_response_rate", self.lost_response_rate),
            ("drop_rate", self.drop_rate),
            ("error_after_processing_rate", self.error_after_processing_rate),
            ("webhook_duplicate_rate", self.webhook_duplicate_rate),
            ("webhook_reorder_rate", self.webhook_reorder_rate),
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
        if Duration::from_millis(self.webhook_delay_ms) > super::MAX_LATENCY {
            return Err(format!(
                "webhook_delay_ms must be at most {} ms",
                super::MAX_LATENCY.as_millis()
            ));
        }
        if self.webhook_retry_base_ms == 0
            || Duration::from_millis(self.webhook_retry_base_ms) > super::MAX_LATENCY
        {
            return Err(format!(
                "webhook_retry_base_ms must be from 1 to {} ms",
                super::MAX_LATENCY.as_millis()
            ));
        }
        if self.key_ttl_s == 0 {
            return Err("key_ttl_s must be at least 1".into());
        }
        if self.authentication_ttl_s == 0 {
            return Err("authentication_ttl_s must be at least 1".into());
        }
        if Duration::from_millis(self.search_lag_ms) > MAX_SEARCH_LAG {
            return Err(format!("search_lag_ms must be at most {} ms", MAX_SEARCH_LAG.as_millis()));
        }
        Ok(())
    }

    /// A key's lifetime in milliseconds.
    pub(super) fn key_ttl_ms(&self) -> u64 {
        self.key_ttl_s.saturating_mul(1000)
    }

    /// How long an authentication waits, in milliseconds.
    pub(super) fn authentication_ttl_ms(&self) -> u64 {
        self.authentication_ttl_s.saturating_mul(1000)
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
    ErrorAfterProcessing,
}

/// Set on a request's extensions by the fault middleware when the request drew "500 after
/// processing": the handler executes the operation, then answers (and keeps) a 500 instead.
#[derive(Debug, Clone, Copy)]
pub(super) struct ErrorAfterProcessing;

#[derive(Debug)]
pub(super) struct Injector {
    config: FaultConfig,
    rng: StdRng,
    /// The webhooks' own draws, so that sending events never shifts the requests' faults.
    webhook_rng: StdRng,
}

/// Mixed into the seed of the webhooks' generator.
const WEBHOOK_SEED_SALT: u64 = 0x5745_4248_4f4f_4b53;

impl Injector {
    pub(super) fn new(config: FaultConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        let webhook_rng = StdRng::seed_from_u64(config.seed ^ WEBHOOK_SEED_SALT);
        Self { config, rng, webhook_rng }
    }

    /// Draws one webhook event's faults. Every event draws the same number of values.
    pub(super) fn webhook_plan(&mut self) -> DeliveryPlan {
        let (duplicate, hold_back): (f64, f64) =
            (self.webhook_rng.r#gen(), self.webhook_rng.r#gen());
        DeliveryPlan {
            delay: Duration::from_millis(self.config.webhook_delay_ms),
            duplicate: duplicate < self.config.webhook_duplicate_rate,
            hold_back: hold_back < self.config.webhook_reorder_rate,
            retry_base: Duration::from_millis(self.config.webhook_retry_base_ms),
        }
    }

    pub(super) fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// Draws this request's fault and delay. Every request draws the same number of values, so
    /// the sequence depends only on the seed and the order of requests.
    pub(super) fn plan(&mut self) -> (Fault, Duration) {
        let draws: [f64; 5] = [
            self.rng.r#gen(),
            self.rng.r#gen(),
            self.rng.r#gen(),
            self.rng.r#gen(),
            self.rng.r#gen(),
        ];
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
        } else if draws[4] < self.config.error_after_processing_rate {
            Fault::ErrorAfterProcessing
        } else {
            Fault::None
        };
        (fault, delay)
    }
}
