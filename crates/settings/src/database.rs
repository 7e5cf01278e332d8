//! `[database]`: the Postgres connection options and the pool both binaries use.

use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

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
