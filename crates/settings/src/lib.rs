//! Configuration of both binaries, `payments-api` and `payments-worker`: the checked-in defaults
//! (`config/default.toml`), then `PAYMENTS__…` environment variables, then `DATABASE_URL`.
//! Everything is validated once, at start-up, and every error names the setting and the
//! environment variable that sets it. One schema for both, so that the worker stores answers
//! exactly as the API would (the same public base URL, the same processor, the same lease).
//!
//! Here: the whole ([`Settings`]), how it is loaded, and why it may not be ([`SettingsError`]).
//! Each section of `config/default.toml` has a file of its own (`server` holds `[http]` and
//! `[rate_limit]`, `proxies` the trusted proxies of `[http]`); the checks at start-up are in
//! `validate`.

use std::collections::HashMap;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
pub use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

mod database;
mod idempotency;
mod inspector;
mod log;
mod processor;
mod ranges;
mod retention;
mod server;
mod validate;
mod webhooks;
mod worker;

pub use database::{DatabaseSettings, IDLE_RECHECK};
pub use idempotency::IdempotencySettings;
pub use inspector::{INSPECTOR_TOKEN_MIN_CHARS, InspectorSettings};
pub use log::{LogFormat, LogSettings};
pub use processor::ProcessorSettings;
pub use ranges::AddressRanges;
pub use retention::{PROCESSOR_REDELIVERY_DAYS, RetentionSettings};
pub use server::{ForwardedHeader, HttpSettings, RateLimitSettings};
pub use webhooks::{SEALING_KEY_BYTES, SealingKey, SealingKeys, WebhookSettings};
pub use worker::WorkerSettings;

/// The defaults, compiled in so that a binary runs from any directory.
const DEFAULTS: &str = include_str!("../../../config/default.toml");
/// Environment variables that override settings start with this, then `__`.
const ENV_PREFIX: &str = "PAYMENTS";

/// All settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The HTTP listener.
    pub http: HttpSettings,
    /// The Postgres connection pool.
    pub database: DatabaseSettings,
    /// Per-account request rates.
    pub rate_limit: RateLimitSettings,
    /// The idempotency engine.
    pub idempotency: IdempotencySettings,
    /// The card processor.
    pub processor: ProcessorSettings,
    /// The background worker.
    pub worker: WorkerSettings,
    /// Logging.
    pub log: LogSettings,
    /// The operator's read-only web page of keys, phases and jobs.
    pub inspector: InspectorSettings,
    /// Outbound webhooks: which URLs may be registered, how deliveries are timed.
    pub webhooks: WebhookSettings,
    /// How long the worker keeps the rows of the tables that only grow.
    pub retention: RetentionSettings,
}

/// Why the settings could not be loaded. The message always names the setting.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value has the wrong type, or a setting is unknown.
    #[error("invalid configuration: {0}")]
    Parse(#[from] config::ConfigError),
    /// A value has the right type but is not acceptable.
    #[error("invalid setting `{setting}` (environment variable {env}): {reason}")]
    Invalid {
        /// The setting's dotted name, e.g. `http.port`.
        setting: &'static str,
        /// The environment variable that sets it.
        env: String,
        /// What is wrong.
        reason: String,
    },
}

impl Settings {
    /// The engine's tunables, with the processor's window: the API and the worker both refuse to
    /// drive a key older than it.
    pub fn engine_config(&self) -> idem::EngineConfig {
        let window = Duration::from_secs(u64::from(self.worker.processor_window_hours) * 3600);
        idem::EngineConfig { processor_window: Some(window), ..self.idempotency.engine_config() }
    }

    /// Loads the settings from the process environment.
    pub fn load() -> Result<Self, SettingsError> {
        Self::load_from(std::env::vars())
    }

    /// Loads the settings from the given environment (tests pass their own).
    pub fn load_from(
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let env: HashMap<String, String> = env.into_iter().collect();
        let settings: Settings = Config::builder()
            .add_source(File::from_str(DEFAULTS, FileFormat::Toml))
            .add_source(
                Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator("__")
                    .separator("__")
                    // Values stay text until a field asks for a number: parsing them up
                    // front would turn a key or token of digits ("007…") into a number and
                    // back into other text.
                    .try_parsing(false)
                    .source(Some(env.clone())),
            )
            .set_override_option("database.url", env.get("DATABASE_URL").cloned())?
            .build()?
            .try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    /// The keys that seal webhook endpoints' signing secrets. The API and the worker need them
    /// (other commands do not), and refuse to start without `webhooks.sealing_key`.
    pub fn sealing_keys(&self) -> Result<SealingKeys, SettingsError> {
        match self.webhooks.read_sealing_keys() {
            Ok(Some(keys)) => Ok(keys),
            Ok(None) => Err(validate::invalid(
                "webhooks.sealing_key",
                "must be set: 64 hexadecimal digits (32 bytes, e.g. from `openssl rand -hex 32`) \
                 that seal the webhook endpoints' signing secrets (make run keeps one under \
                 target/)"
                    .into(),
            )),
            Err((setting, reason)) => Err(validate::invalid(setting, reason)),
        }
    }

    /// The base of public links, without a trailing slash, once the port is known.
    pub fn public_base_url(&self, bound_port: u16) -> String {
        if self.http.public_base_url.is_empty() {
            format!("http://{}:{bound_port}", self.http.host)
        } else {
            self.http.public_base_url.trim_end_matches('/').to_owned()
        }
    }
}

#[cfg(test)]
mod tests;
