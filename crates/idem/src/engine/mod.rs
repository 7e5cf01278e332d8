//! The engine, one file for each word of the glossary:
//!
//! - [`claim`]: a request's claim of a key (a read, and a takeover when the key is free);
//! - [`lease`]: the lease a claim grants, and what its holder does besides phases (check it
//!   before a foreign call, flag the key, give it back);
//! - [`phase`]: an atomic phase, a transaction fenced on the lease ([`FencedTx`]);
//! - [`drive`]: what an operation is written against, and the loop that drives it from its
//!   recovery point to its end;
//! - [`completer`] and [`reaper`]: the worker's two sweeps of the key table;
//! - [`held_leases`]: the leases this process holds, given back when it stops;
//! - [`give_back`]: a lease given back at once when its holder cannot use it, even while the
//!   database's connections are being ended;
//! - [`replay_cache`]: finished answers kept in memory, so a replay may skip the database;
//! - [`fast_path`]: phases as one statement, and a first phase that claims its key; skip it on a
//!   first read.

mod claim;
mod completer;
mod drive;
mod fast_path;
mod give_back;
mod held_leases;
mod lease;
mod phase;
mod reaper;
mod replay_cache;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use payments_backoff::{Backoff, Jitter};
use sqlx::PgPool;

use crate::connections::SideConnections;
use crate::error::{IdemError, is_retryable};
use crate::observe::{Event, Observer};

pub use claim::{Claim, Open, Read, Request};
pub use completer::Due;
pub use drive::{Interrupted, Operation, TransientKind, drive};
pub use fast_path::{ClaimArgs, First, ONE_STATEMENT_TIMEOUT};
use held_leases::Held;
pub use lease::Lease;
pub use phase::{FencedTx, Step};
pub use reaper::Reaped;

/// The SQLSTATE `idem_commit_fence` raises when the fence refuses: the lease is lost.
const LEASE_LOST: &str = "IL001";

/// The recovery point every new key starts at.
pub const STARTED: &str = "started";
/// The recovery point of a key with a stored response.
pub const FINISHED: &str = "finished";

/// The recovery points of one operation, as an enum the operation defines. The engine stores
/// them by name and refuses names it cannot map back.
pub trait RecoveryPoint: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// The stored name. The first point must be called `"started"`.
    fn name(self) -> &'static str;
    /// The point with this name, or `None` for a name the operation does not define.
    fn from_name(name: &str) -> Option<Self>;
}

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long a lease lasts after a claim or a phase commit. Must be longer than the longest
    /// foreign call an operation makes between two phases, retries included.
    pub lease: Duration,
    /// How many times a statement or phase that hit a serialization failure, deadlock or
    /// concurrent unique violation is tried again before the error is surfaced.
    pub db_retries: u32,
    /// First delay before the completer retries a released key; doubles per attempt.
    pub retry_base: Duration,
    /// Longest delay before the completer retries a released key.
    pub retry_cap: Duration,
    /// Connections the engine keeps for the claim statement, beside the pool (`connections.rs`), with
    /// their waits bounded by `claim_timeout`; 0 runs claims on the pool instead.
    pub claim_connections: usize,
    /// Connections the engine keeps for one-statement phases, beside the pool (`connections.rs`): given
    /// back without the pool's check when the statement returned; 0 runs them on the pool.
    pub phase_connections: usize,
    /// How long the downstream service remembers the idempotency keys we send it (Stripe: 24 h),
    /// less a margin. An unfinished key older than this is never driven again by anyone, neither
    /// a retry nor a takeover nor the completer, because a call made now could act a second time;
    /// it is flagged for a person. `None`: no such window.
    pub processor_window: Option<Duration>,
    /// The longest a claim statement may run or wait for a row lock on a claim connection
    /// (`statement_timeout`, `lock_timeout`): a key row held by a stuck transaction must not
    /// hold a claim connection, and every request waiting for one, for ever.
    pub claim_timeout: Duration,
    /// Bytes of finished answers kept in memory to answer replays from (`replay_cache.rs`); 0 keeps
    /// none, and every replay reads its key.
    pub answer_memory: usize,
    /// How long a finished key is kept before the reaper deletes it: the reaper's own setting.
    /// An answer kept in memory is used only inside it.
    pub retention: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            db_retries: 5,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(300),
            claim_connections: 8,
            phase_connections: 8,
            processor_window: Some(Duration::from_secs(20 * 3600)),
            claim_timeout: Duration::from_secs(2),
            answer_memory: 8 << 20,
            retention: Duration::from_secs(24 * 3600),
        }
    }
}

impl EngineConfig {
    /// What a lease must cover beyond the longest foreign call: the last phase's start. A phase
    /// holds its key from its first statement (`store::begin_holding`), so a lease that lasts
    /// until the last phase begins covers it however long it then waits. Before a general phase
    /// the last phase may try one statement (a row of a batch, bounded by [`batch::DEADLINE`]
    /// and [`batch::ANSWER_GRACE`], then alone, bounded by [`ONE_STATEMENT_TIMEOUT`]); the rest
    /// (2.5 s) is for a pooled connection (`database.acquire_timeout_ms`, 2 s by default) and
    /// the round trips.
    ///
    /// [`batch::DEADLINE`]: crate::batch::DEADLINE
    /// [`batch::ANSWER_GRACE`]: crate::batch::ANSWER_GRACE
    pub const LEASE_MARGIN: Duration = Duration::from_secs(5);

    /// Checks, at start-up, that a lease outlives the longest foreign call (with its retries)
    /// by [`EngineConfig::LEASE_MARGIN`].
    pub fn check_lease_covers(&self, longest_foreign_call: Duration) -> Result<(), String> {
        let needed = longest_foreign_call + Self::LEASE_MARGIN;
        if self.lease < needed {
            return Err(format!(
                "the lease ({} ms) must be at least {} ms: the longest processor call with its \
                 retries ({} ms), plus five seconds",
                self.lease.as_millis(),
                needed.as_millis(),
                longest_foreign_call.as_millis()
            ));
        }
        Ok(())
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    fn window_ms(&self) -> Option<i64> {
        self.processor_window.map(|window| i64::try_from(window.as_millis()).unwrap_or(i64::MAX))
    }

    fn claim_timeout_ms(&self) -> i64 {
        i64::try_from(self.claim_timeout.as_millis()).unwrap_or(i64::MAX).max(1)
    }

    /// Delay before the completer's attempt after `attempts` attempts: `retry_base` doubling up
    /// to `retry_cap`, exactly (the key's `next_attempt_at` is a schedule a person reads back).
    pub fn retry_delay(&self, attempts: i32) -> Duration {
        let schedule = Backoff::new(self.retry_base, self.retry_cap, Jitter::None);
        schedule.delay(u32::try_from(attempts).unwrap_or(0))
    }
}

/// The idempotency engine over one Postgres pool.
#[derive(Clone)]
pub struct Engine {
    pool: PgPool,
    config: Arc<EngineConfig>,
    observer: Arc<dyn Observer>,
    /// The connections kept for claims, started on the first claim, so that an engine that
    /// never claims (the worker's) opens no connections for it.
    claims: Arc<OnceLock<Arc<SideConnections>>>,
    /// Started on the first one-statement phase, likewise.
    phases: Arc<OnceLock<Arc<SideConnections>>>,
    /// The leases this process holds, so that a shutdown can give back those it cannot finish
    /// (`release_held`). A lease leaves when it is dropped.
    held: Arc<Mutex<Held>>,
    /// Finished answers kept in memory, and the fresh read replays from them share.
    replay_cache: Arc<replay_cache::ReplayCache>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with the given tunables and an observer for metrics.
    pub fn new(pool: PgPool, config: EngineConfig, observer: Arc<dyn Observer>) -> Self {
        Self {
            pool,
            replay_cache: Arc::new(replay_cache::ReplayCache::new(
                config.answer_memory,
                config.retention,
            )),
            config: Arc::new(config),
            observer,
            claims: Arc::default(),
            phases: Arc::default(),
            held: Arc::default(),
        }
    }

    /// The pool the engine works on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The tunables.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The connections kept for claims, started on first use; `None` when claims use the pool.
    /// Their sessions bound every statement and lock wait by `claim_timeout`.
    fn claim_connections(&self) -> Option<&Arc<SideConnections>> {
        let count = self.config.claim_connections;
        (count > 0).then(|| {
            self.claims.get_or_init(|| {
                let bound = format!("{}ms", self.config.claim_timeout_ms());
                let options = (*self.pool.connect_options()).clone().options([
                    ("lock_timeout", bound.as_str()),
                    ("statement_timeout", bound.as_str()),
                ]);
                SideConnections::start(&self.pool, count, options)
            })
        })
    }

    /// The connections kept for one-statement phases, started on first use; `None` when those
    /// phases use the pool.
    fn phase_connections(&self) -> Option<&Arc<SideConnections>> {
        let count = self.config.phase_connections;
        (count > 0).then(|| {
            self.phases.get_or_init(|| {
                let bound = format!("{}ms", fast_path::ONE_STATEMENT_TIMEOUT.as_millis());
                let options = (*self.pool.connect_options())
                    .clone()
                    .options([("statement_timeout", bound.as_str())]);
                SideConnections::start(&self.pool, count, options)
            })
        })
    }

    /// Runs `statement` again on retryable errors, a bounded number of times.
    async fn retrying<T, F, Fut>(&self, mut statement: F) -> Result<T, IdemError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, IdemError>>,
    {
        let mut tries = 0;
        loop {
            match statement().await {
                Err(IdemError::Database(err))
                    if is_retryable(&err) && tries < self.config.db_retries =>
                {
                    tries += 1;
                    self.observer.event(Event::DatabaseRetry);
                    tokio::time::sleep(DB_RETRY.delay(tries)).await;
                }
                other => return other,
            }
        }
    }
}

/// The pause before a statement or phase runs again after a serialization failure, deadlock or
/// concurrent unique violation: 2 ms doubling to 256 ms, drawn below that at random, so that the
/// transactions that collided do not collide again in step.
const DB_RETRY: Backoff =
    Backoff::new(Duration::from_millis(2), Duration::from_millis(256), Jitter::Full);
