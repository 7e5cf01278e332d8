//! Configuration of both binaries, `payments-api` and `payments-worker`: the checked-in defaults
//! (`config/default.toml`), then `PAYMENTS__…` environment variables, then `DATABASE_URL`.
//! Everything is validated once, at start-up, and every error names the setting and the
//! environment variable that sets it. One schema for both, so that the worker stores answers
//! exactly as the API would (the same public base URL, the same processor, the same lease).

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
pub use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

mod validate;

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
}

/// `[webhooks]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Allow endpoints on loopback addresses (127.0.0.0/8, ::1, `localhost`), for local runs and
    /// tests. Private, link-local and other special addresses are refused regardless.
    pub allow_loopback: bool,
    /// The longest one delivery may take, connection included; past it the attempt failed.
    pub timeout_ms: u64,
    /// First delay before a failed delivery is tried again; doubles per attempt, with jitter.
    pub backoff_base_ms: u64,
    /// The longest delay between two attempts.
    pub backoff_cap_ms: u64,
    /// A delivery still failing this long after its event was created is dead-lettered.
    pub horizon_hours: u32,
}

/// `[inspector]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InspectorSettings {
    /// Serve `/inspector`.
    pub enabled: bool,
    /// The operator token the page asks for. Never logged.
    pub token: SecretString,
    /// Where the guide (`docs/`) is published, e.g. a repository's web view; its links are this
    /// followed by `/docs/…`. Empty: the inspector names the guide's files by their path in the
    /// repository instead of linking them.
    pub docs_base_url: String,
}

impl std::fmt::Debug for InspectorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InspectorSettings")
            .field("enabled", &self.enabled)
            .field("docs_base_url", &self.docs_base_url)
            .finish_non_exhaustive()
    }
}

/// The shortest operator token accepted.
pub const INSPECTOR_TOKEN_MIN_CHARS: usize = 16;

/// `[http]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    /// The base of links the API hands out; empty means `http://{host}:{port}`.
    pub public_base_url: String,
    /// Largest accepted request body.
    pub body_limit_bytes: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace_ms: u64,
    /// Limit for a request's line and headers, counted from when the connection waits for a
    /// request (so it also bounds an idle keep-alive connection).
    pub header_read_timeout_ms: u64,
    /// Largest request line and headers, in bytes; larger is `431` and the connection closes.
    /// Bounds what a connection that is still sending its headers holds in memory.
    pub max_header_bytes: u64,
    /// Longest a write to the client may make no progress (the client stopped reading its
    /// answers); past it the connection is closed.
    pub write_timeout_ms: u64,
    /// Longest pause between two pieces of a request body.
    pub body_timeout_ms: u64,
    /// Limit for a whole request, headers to answer.
    pub request_timeout_ms: u64,
    /// Open connections at most.
    pub max_connections: u32,
    /// Requests served at once at most; more are answered 503.
    pub max_in_flight_requests: u32,
}

/// `[rate_limit]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// Sustained requests per second per account; 0 turns the limit off.
    pub per_second: u32,
    /// Requests an account may make at once.
    pub burst: u32,
    /// Lookups of API keys per second per client address (keys neither known to be live nor
    /// found unknown lately); 0: no limit.
    pub per_address_per_second: u32,
    /// Such requests one address may make at once.
    pub per_address_burst: u32,
    /// How long an unknown API key is answered 401 without a lookup.
    pub unknown_key_cache_ms: u64,
}

/// `[database]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// A `postgres://` URL. Never logged: it may hold a password.
    pub url: SecretString,
    /// Size of the connection pool.
    pub max_connections: u32,
    /// How long a request waits for a connection.
    pub acquire_timeout_ms: u64,
    /// Postgres' `statement_timeout` for the pool's sessions; 0 leaves the server's default.
    pub statement_timeout_ms: u64,
}

/// `[idempotency]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    /// Lease length after each claim or phase commit.
    pub lease_ms: u64,
    /// Retries of serialization failures and deadlocks.
    pub db_retries: u32,
    /// How long completed keys are kept at least.
    pub retention_hours: u32,
    /// Connections kept for the claim statement, beside the pool; 0: claims use the pool.
    pub claim_connections: u32,
    /// The longest a claim statement on those connections runs or waits for a row lock.
    pub claim_timeout_ms: u64,
    /// Connections kept for one-statement phases, beside the pool; 0: they use the pool.
    pub phase_connections: u32,
    /// Bytes of finished answers the API keeps in memory to answer replays from; 0: none.
    pub answer_memory_bytes: u64,
    /// Whether concurrent one-statement phases of one kind share a statement (`idem::batch`).
    pub batch_phases: bool,
    /// Whether a new payment's phases take the fast path (one statement each where they can, the
    /// claim in the first) or the reference road (a transaction each). Both write the same.
    pub fast_path: bool,
}

impl IdempotencySettings {
    /// The engine's tunables.
    pub fn engine_config(&self) -> idem::EngineConfig {
        idem::EngineConfig {
            lease: Duration::from_millis(self.lease_ms),
            db_retries: self.db_retries,
            claim_connections: self.claim_connections as usize,
            phase_connections: self.phase_connections as usize,
            claim_timeout: Duration::from_millis(self.claim_timeout_ms),
            answer_memory: usize::try_from(self.answer_memory_bytes).unwrap_or(usize::MAX),
            retention: Duration::from_secs(u64::from(self.retention_hours) * 3600),
            ..idem::EngineConfig::default()
        }
    }
}

/// `[processor]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSettings {
    /// Where the processor answers.
    pub base_url: String,
    /// The key presented to it. Never printed.
    pub api_key: SecretString,
    /// Limit for opening a connection.
    pub connect_timeout_ms: u64,
    /// Limit for one request.
    pub request_timeout_ms: u64,
    /// Retries after the first try.
    pub max_retries: u32,
    /// First back-off ceiling.
    pub backoff_base_ms: u64,
    /// Largest back-off ceiling.
    pub backoff_cap_ms: u64,
    /// Longest `Retry-After` honoured.
    pub retry_after_cap_ms: u64,
    /// How far the processor's search may trail its writes; a reconciliation trusts a search
    /// that finds nothing only once the call it looks for is older than this plus the longest
    /// call.
    pub search_lag_ms: u64,
    /// Further `metadata[…]` members sent with every new charge (a deployment's own tags).
    /// Frozen with each charge request: changing them never changes a request in flight.
    #[serde(default)]
    pub charge_metadata: BTreeMap<String, String>,
    /// The signing secret (`whsec_…`) of the processor's webhooks to `POST /webhooks/processor`;
    /// empty turns that endpoint off (it answers 404). Never printed.
    pub webhook_secret: SecretString,
    /// How far a webhook's signed timestamp may be from now, in seconds; an older one is a
    /// replay and is refused.
    pub webhook_tolerance_s: u64,
    /// Webhooks whose bodies are read and verified at once, outside
    /// `http.max_in_flight_requests` (their senders are not known yet); more are answered 503.
    /// A verified webhook counts toward `http.max_in_flight_requests` like any other request.
    pub webhook_max_unverified: u32,
}

impl std::fmt::Debug for ProcessorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessorSettings")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl ProcessorSettings {
    /// The client's configuration.
    pub fn client_config(&self) -> provider::ProcessorConfig {
        provider::ProcessorConfig {
            base_url: self.base_url.trim_end_matches('/').to_owned(),
            api_key: self.api_key.expose_secret().to_owned(),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            max_retries: self.max_retries,
            backoff_base: Duration::from_millis(self.backoff_base_ms),
            backoff_cap: Duration::from_millis(self.backoff_cap_ms),
            retry_after_cap: Duration::from_millis(self.retry_after_cap_ms),
            search_lag: Duration::from_millis(self.search_lag_ms),
        }
    }
}

/// `[worker]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Pause between passes when a pass found nothing to do.
    pub interval_ms: u64,
    /// Most keys, old keys or jobs taken in one batch.
    pub batch_size: u32,
    /// After this many runs of the completer's own (`completer_attempts`; a client's retries do
    /// not count) an unfinished key waits for a person.
    pub max_attempts: u32,
    /// An unfinished key older than this waits for a person: the processor forgets its own
    /// idempotency keys after 24 hours, and a retry after that could charge twice.
    pub processor_window_hours: u32,
    /// After this many attempts a job is dead-lettered.
    pub job_max_attempts: u32,
    /// First delay before a failed job runs again; doubles per attempt.
    pub job_backoff_base_ms: u64,
    /// SMTP server for receipts, `smtp://host:port` or `smtps://…`; empty records receipts in
    /// the database and the log instead.
    pub smtp_url: SecretString,
    /// The sender of receipts.
    pub receipt_from: String,
    /// The worker's own `/metrics` port on 127.0.0.1; 0 turns it off.
    pub metrics_port: u16,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// Output format.
    pub format: LogFormat,
    /// A tracing filter directive; `RUST_LOG` wins when set.
    pub filter: String,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable, coloured when on a terminal.
    Pretty,
    /// One JSON object per line.
    Json,
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

    /// The base of public links, without a trailing slash, once the port is known.
    pub fn public_base_url(&self, bound_port: u16) -> String {
        if self.http.public_base_url.is_empty() {
            format!("http://{}:{bound_port}", self.http.host)
        } else {
            self.http.public_base_url.trim_end_matches('/').to_owned()
        }
    }
}

impl DatabaseSettings {
    /// The parsed connection options.
    pub fn connect_options(&self) -> Result<PgConnectOptions, sqlx::Error> {
        let options = PgConnectOptions::from_str(self.url.expose_secret())?;
        Ok(if self.statement_timeout_ms > 0 {
            options.options([("statement_timeout", format!("{}ms", self.statement_timeout_ms))])
        } else {
            options
        })
    }

    /// How long a request waits for a pooled connection.
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms)
    }

    /// The pool both binaries use, connecting lazily (a server starts while the database is
    /// away, and `/readyz` says so).
    ///
    /// sqlx checks a connection with a round trip (`Sync`, answered by `ReadyForQuery`) every
    /// time it goes back to the pool; by default it checks it again every time it is taken out,
    /// which makes a statement outside a transaction (a replay's one statement) three exchanges.
    /// Here only a connection that has sat idle for [`IDLE_RECHECK`] is checked again on the way
    /// out: one that was just checked on its way in has nothing new to tell. A connection the
    /// server dropped in that second fails its next statement (an error the request answers as a
    /// retryable 500/503) and is then discarded. `make bench` measured the difference: see
    /// BENCHMARKS.md.
    pub fn pool(&self) -> Result<PgPool, sqlx::Error> {
        Ok(PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout())
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_RECHECK {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(self.connect_options()?))
    }
}

/// How long a pooled connection may sit idle before it is checked again when taken out.
pub const IDLE_RECHECK: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests;
