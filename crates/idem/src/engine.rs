//! The engine: claims, leases, phases, and the loop that drives an operation to its end.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use tracing::Instrument;
use uuid::Uuid;

use crate::error::{IdemError, PhaseError, is_retryable};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::lanes::Lanes;
use crate::observe::{Event, Observer};
use crate::response::StoredResponse;
use crate::store::{self, Lookup, Seen};

/// The SQLSTATE `idem_commit` raises when the fence refuses: the lease is lost.
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
    /// Connections the engine keeps for the claim statement, beside the pool (`lanes.rs`); 0
    /// runs claims on the pool instead.
    pub claim_connections: usize,
    /// How long the downstream service remembers the idempotency keys we send it (Stripe: 24 h),
    /// less a margin. An unfinished key older than this is never driven again by anyone, neither
    /// a retry nor a takeover nor the completer, because a call made now could act a second time;
    /// it is flagged for a person. `None`: no such window.
    pub processor_window: Option<Duration>,
    /// The longest a claim statement may run or wait for a row lock on a claim lane
    /// (`statement_timeout`, `lock_timeout`): a key row held by a stuck transaction must not
    /// hold a lane, and every request queued behind it, for ever.
    pub claim_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            db_retries: 5,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(300),
            claim_connections: 8,
            processor_window: Some(Duration::from_secs(20 * 3600)),
            claim_timeout: Duration::from_secs(2),
        }
    }
}

impl EngineConfig {
    /// Checks, at start-up, that a lease outlives the longest foreign call (with its retries),
    /// with five seconds to spare for the phase commits around it.
    pub fn check_lease_covers(&self, longest_foreign_call: Duration) -> Result<(), String> {
        let needed = longest_foreign_call + Duration::from_secs(5);
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

    /// Delay before the completer's attempt after `attempts` attempts.
    pub fn retry_delay(&self, attempts: i32) -> Duration {
        let exponent = u32::try_from(attempts.saturating_sub(1)).unwrap_or(0).min(20);
        self.retry_base.saturating_mul(1 << exponent).min(self.retry_cap)
    }
}

/// A request to claim a key.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The scope of the key.
    pub account_id: &'a str,
    /// The SHA-256 digest of the API key the request presents, when the caller has not checked
    /// it yet: the claim checks, in the same statement, that it is a live key of `account_id`,
    /// and claims and reads nothing when it is not (`Claim::Unauthenticated`). `None` when the
    /// caller authenticated the request itself.
    pub credential: Option<&'a [u8]>,
    /// The key.
    pub key: &'a IdempotencyKey,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// For the mismatch message.
    pub method: &'a str,
    /// For the mismatch message.
    pub path: &'a str,
    /// Kept with the key: stored problem bodies carry the first request's id.
    pub request_id: &'a str,
    /// The operation's name, so the completer knows what to resume.
    pub operation: &'a str,
    /// The operation's input, so the completer can resume without the HTTP request.
    pub params: &'a Value,
}

/// What a claim decided.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // matched at once by the caller; a box would allocate per claim
pub enum Claim {
    /// This request holds the key: a new key, or one resumed from its recovery point. A new key
    /// is stored by its first phase; until then no one else sees it, and a request that stored it
    /// first makes that phase fail with `Superseded` (claim again).
    Acquired(Lease),
    /// The key has a final answer; send it again.
    Replay(StoredResponse),
    /// Another request holds the lease right now.
    InUse,
    /// The key was first used for another request.
    Mismatch {
        /// The first request's method.
        method: String,
        /// The first request's path.
        path: String,
    },
    /// The key is unfinished and waits for a person; it is never resumed automatically.
    NeedsHuman,
    /// The request's credential is not a live API key of the account (revoked since the caller
    /// learnt its account): nothing was claimed or read.
    Unauthenticated,
}

/// The idempotency engine over one Postgres pool.
#[derive(Clone)]
pub struct Engine {
    pool: PgPool,
    config: Arc<EngineConfig>,
    observer: Arc<dyn Observer>,
    /// Started on the first claim, so that an engine that never claims (the worker's) opens no
    /// connections for it.
    lanes: Arc<OnceLock<Lanes>>,
    /// The leases this process holds, so that a shutdown can give back those it cannot finish
    /// (`release_held`). A lease leaves when it is dropped.
    held: Arc<Mutex<Held>>,
}

/// The leases a process holds (key id, token), and whether it still takes new ones.
#[derive(Default)]
struct Held {
    leases: HashMap<i64, Uuid>,
    /// Set by `release_held`: a lease the database grants after it is given back at once, so
    /// that a claim already on its way when the shutdown gave up cannot leave its key leased to
    /// a process about to exit.
    closed: bool,
    /// How many new keys are being stored right now (a first phase or `store_new` on its way to
    /// the database), which `release_held` waits for: the database may grant such a lease after
    /// the release looked, and an `UPDATE` cannot release a row another transaction has not
    /// committed yet.
    storing: usize,
}

/// A new key on its way to being stored; `release_held` waits until none is.
struct Storing<'e>(&'e Engine);

impl Drop for Storing<'_> {
    fn drop(&mut self) {
        let mut held = self.0.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.storing = held.storing.saturating_sub(1);
    }
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
            config: Arc::new(config),
            observer,
            lanes: Arc::default(),
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

    /// Claims a key: one round trip for a new key, a replay, a mismatch or a key in use; a
    /// second one to take over an unfinished key whose lease is free or expired.
    pub async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, IdemError> {
        let span = tracing::debug_span!("idem.claim", operation = request.operation);
        self.claim_inner(request).instrument(span).await
    }

    async fn claim_inner(&self, request: &ClaimRequest<'_>) -> Result<Claim, IdemError> {
        let lookup = Lookup {
            account_id: request.account_id.to_owned(),
            credential: request.credential.map(<[u8]>::to_vec),
            key: request.key.as_str().to_owned(),
        };
        for _ in 0..=self.config.db_retries {
            let seen = match self.lanes() {
                Some(lanes) => self.retrying(|| lanes.read(lookup.clone())).await?,
                None => self.retrying(|| store::read(&self.pool, &lookup)).await?,
            };
            let row = match seen {
                Seen::Key(row) => row,
                Seen::Unauthenticated => return Ok(Claim::Unauthenticated),
                // A new key: nothing is stored until the first phase commits, which inserts the
                // key with its own writes (`Lease::phase`, `Lease::phase_in_one`). The lease is
                // this request's alone until then, because no one else can see it.
                Seen::Absent(reserved) => {
                    self.observer.event(Event::Claimed);
                    let new = NewKey {
                        account_id: request.account_id.to_owned(),
                        key: request.key.as_str().to_owned(),
                        fingerprint: request.fingerprint,
                        method: request.method.to_owned(),
                        path: request.path.to_owned(),
                    };
                    let lease = Lease {
                        engine: self.clone(),
                        key_id: reserved,
                        token: Uuid::new_v4(),
                        point: STARTED.to_owned(),
                        attempts: 1,
                        operation: request.operation.to_owned(),
                        params: request.params.clone(),
                        request_id: request.request_id.to_owned(),
                        finished: None,
                        just_planned: None,
                        new: Some(Box::new(new)),
                    };
                    // A process that is stopping takes no new work (`release_held`).
                    if !self.hold(lease.key_id, lease.token) {
                        return Ok(Claim::InUse);
                    }
                    return Ok(Claim::Acquired(lease));
                }
            };
            if row.fingerprint != request.fingerprint.as_bytes() {
                self.observer.event(Event::Mismatch);
                return Ok(Claim::Mismatch { method: row.request_method, path: row.request_path });
            }
            if let Some(response) = row.response {
                self.observer.event(Event::Replayed);
                return Ok(Claim::Replay(response));
            }
            if row.needs_human {
                return Ok(Claim::NeedsHuman);
            }
            if row.lease_active {
                self.observer.event(Event::InUse);
                return Ok(Claim::InUse);
            }
            // The stall tests stop here, between reading the row and taking it over.
            crate::failpoint(|| "idem.claim.before_take_over".to_owned()).await;
            let (window_ms, lease_ms) = (self.config.window_ms(), self.config.lease_ms());
            let token = Uuid::new_v4();
            let taken = self
                .retrying(|| async {
                    // Bounded like a claim lane's statement: the row may be held by a stuck
                    // transaction that updated it after the claim read it.
                    let mut tx = self.pool.begin().await?;
                    store::bound_waits(&mut tx, self.config.claim_timeout_ms()).await?;
                    let owner = row.owner_token;
                    let taken = store::take_over(
                        &mut *tx,
                        row.id,
                        owner,
                        token,
                        lease_ms,
                        request.request_id,
                        window_ms,
                    )
                    .await?;
                    tx.commit().await?;
                    Ok(taken)
                })
                .await?;
            match taken {
                store::TakeOver::Taken(point, attempts) => {
                    let event =
                        if row.owner_token.is_some() { Event::TookOver } else { Event::Resumed };
                    self.observer.event(event);
                    tracing::info!(key_id = row.id, recovery_point = %point, attempts, ?event, "resuming an idempotency key");
                    let Some(lease) = self.lease(row.id, token, point, attempts, &row).await else {
                        return Ok(Claim::InUse);
                    };
                    crate::failpoint(|| "idem.claim.taken_over".to_owned()).await;
                    return Ok(Claim::Acquired(lease));
                }
                store::TakeOver::Flagged => {
                    self.observer.event(Event::Flagged);
                    tracing::error!(
                        key_id = row.id,
                        reason = "older than the processor's idempotency window",
                        "an idempotency key needs a person"
                    );
                    return Ok(Claim::NeedsHuman);
                }
                // Someone else took it or finished it between the read and the swap: look again.
                store::TakeOver::Missed => {}
            }
        }
        Err(IdemError::Contended)
    }

    /// The completer's claim: up to `limit` unfinished keys whose lease is free or expired and
    /// whose next attempt is due, each leased to this process. The completer asks for one key at
    /// a time and drives it before asking again: a key leased while it waits behind others can
    /// see its lease run out before its turn comes. A key with more than
    /// `max_attempts` attempts, or created longer than `window` ago, is flagged for a person
    /// instead (returned as `Due::Flagged`) and never retried automatically.
    pub async fn take_due(
        &self,
        limit: u32,
        max_attempts: u32,
        window: Duration,
    ) -> Result<Vec<Due>, IdemError> {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let lease_ms = self.config.lease_ms();
        let rows = self
            .retrying(|| async {
                Ok(store::take_due(&self.pool, i64::from(limit), lease_ms, window_ms).await?)
            })
            .await?;
        let mut due = Vec::with_capacity(rows.len());
        for row in rows {
            let reason = if row.too_old {
                Some("older than the processor's idempotency window".to_owned())
            } else if u32::try_from(row.attempts).unwrap_or(u32::MAX) > max_attempts {
                Some(format!("gave up after {max_attempts} attempts"))
            } else {
                None
            };
            if let Some(reason) = reason {
                store::flag(&self.pool, row.id, row.token, &reason).await?;
                self.observer.event(Event::Flagged);
                tracing::error!(
                    key_id = row.id,
                    recovery_point = %row.recovery_point,
                    attempts = row.attempts,
                    reason,
                    "an idempotency key needs a person"
                );
                due.push(Due::Flagged { key_id: row.id, reason });
                continue;
            }
            self.observer.event(Event::TookOver);
            if !self.hold_granted(row.id, row.token).await {
                continue;
            }
            due.push(Due::Lease(Lease {
                engine: self.clone(),
                key_id: row.id,
                token: row.token,
                point: row.recovery_point,
                attempts: row.attempts,
                operation: row.operation,
                params: row.request_params,
                request_id: row.request_id,
                finished: None,
                just_planned: None,
                new: None,
            }));
        }
        Ok(due)
    }

    /// The reaper: deletes up to `limit` keys completed longer than `retention` ago. Unfinished
    /// keys are never deleted; those created longer than `retention` ago are flagged for a person
    /// instead.
    pub async fn reap(&self, limit: u32, retention: Duration) -> Result<Reaped, IdemError> {
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let deleted = store::reap(&self.pool, i64::from(limit), retention_ms).await?;
        let flagged = store::flag_stale(&self.pool, retention_ms).await?;
        for _ in 0..flagged {
            self.observer.event(Event::Flagged);
        }
        Ok(Reaped { deleted, flagged })
    }

    /// Gives back, at their recovery points, every lease this process still holds, for a
    /// shutdown that cannot wait for them: their keys can be resumed at once (a retry, another
    /// process's completer) instead of after the lease. A holder still running loses its next
    /// fenced commit. Returns how many were released.
    pub async fn release_held(&self, reason: &str) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
        // No new key starts being stored from now on. Those already on their way give their
        // lease back themselves once their commit is acknowledged (`Lease::stored`); wait for
        // them, a bounded while, since the process exits when this returns.
        let deadline = tokio::time::Instant::now() + self.config.claim_timeout;
        while self.held.lock().unwrap_or_else(PoisonError::into_inner).storing > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let held: Vec<(i64, Uuid)> = {
            let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.leases.iter().map(|(key_id, token)| (*key_id, *token)).collect()
        };
        let mut released = 0;
        for (key_id, token) in held {
            if self.give_back(key_id, token, reason).await {
                released += 1;
            }
        }
        released
    }

    /// Releases one lease at its recovery point, now. False if it was no longer ours or the
    /// database could not be reached (the lease then runs out by itself).
    async fn give_back(&self, key_id: i64, token: Uuid, reason: &str) -> bool {
        match store::release(&self.pool, key_id, token, reason, 0).await {
            Ok(true) => {
                self.observer.event(Event::Released);
                true
            }
            Ok(false) => false,
            Err(err) => {
                tracing::warn!(key_id, error = %err, "could not release an idempotency key at shutdown");
                false
            }
        }
    }

    /// Records a lease this process holds. After `release_held` it is not recorded, and false is
    /// returned: the caller must give it back (if the database granted it) and not use it.
    fn hold(&self, key_id: i64, token: Uuid) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.closed {
            return false;
        }
        held.leases.insert(key_id, token);
        true
    }

    /// Records a lease the database just granted, or, when the process is stopping, gives it
    /// back at once and answers false.
    async fn hold_granted(&self, key_id: i64, token: Uuid) -> bool {
        if self.hold(key_id, token) {
            return true;
        }
        self.give_back(key_id, token, "the server was stopping when the lease was granted").await;
        false
    }

    /// Counts a new key on its way to being stored, or `None` once `release_held` ran: a
    /// process that is stopping stores no new key.
    fn storing(&self) -> Option<Storing<'_>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.closed {
            return None;
        }
        held.storing += 1;
        Some(Storing(self))
    }

    /// For a phase that may store a new key (`new`): its count while it runs, or, once the
    /// process is stopping, a lost lease (nothing was written; a retry runs it elsewhere).
    fn storing_new<E>(&self, new: bool) -> Result<Option<Storing<'_>>, PhaseError<E>> {
        if !new {
            return Ok(None);
        }
        self.storing().map(Some).ok_or(PhaseError::LeaseLost)
    }

    /// Whether `release_held` ran: the process is stopping.
    fn is_closed(&self) -> bool {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).closed
    }

    fn forget(&self, key_id: i64, token: Uuid) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.leases.get(&key_id) == Some(&token) {
            held.leases.remove(&key_id);
        }
    }

    /// The lease the database just granted, or `None` when the process is stopping (it was
    /// given back already).
    async fn lease(
        &self,
        key_id: i64,
        token: Uuid,
        point: String,
        attempts: i32,
        row: &store::KeyRow,
    ) -> Option<Lease> {
        if !self.hold_granted(key_id, token).await {
            return None;
        }
        Some(Lease {
            engine: self.clone(),
            key_id,
            token,
            point,
            attempts,
            operation: row.operation.clone(),
            params: row.request_params.clone(),
            request_id: row.request_id.clone(),
            finished: None,
            just_planned: None,
            new: None,
        })
    }

    /// The claim lanes, started on first use; `None` when claims use the pool.
    fn lanes(&self) -> Option<&Lanes> {
        let count = self.config.claim_connections;
        (count > 0).then(|| {
            self.lanes.get_or_init(|| Lanes::start(&self.pool, count, self.config.claim_timeout))
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
                    tokio::time::sleep(retry_pause(tries)).await;
                }
                other => return other,
            }
        }
    }
}

/// What the completer found.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one at a time, matched at once; a box would only allocate
pub enum Due {
    /// A key to drive to its end.
    Lease(Lease),
    /// A key flagged for a person instead.
    Flagged {
        /// The key's row id.
        key_id: i64,
        /// Why.
        reason: String,
    },
}

/// What one reaper batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Completed keys deleted.
    pub deleted: u64,
    /// Unfinished keys past retention flagged for a person.
    pub flagged: u64,
}

/// Lower-case hexadecimal, as `idem_commit` decodes it.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

fn retry_pause(tries: u32) -> Duration {
    Duration::from_millis(2u64.saturating_pow(tries.min(8)))
}

/// The right to run an operation's next phase, held by exactly one process at a time.
///
/// Every phase commit is fenced on this lease's token and the recovery point it expects, so a
/// holder that lost the lease (it was too slow, and another process took the key over) can never
/// commit anything.
pub struct Lease {
    engine: Engine,
    key_id: i64,
    token: Uuid,
    point: String,
    attempts: i32,
    operation: String,
    params: Value,
    request_id: String,
    finished: Option<StoredResponse>,
    /// The call this lease's own last phase planned, committed a moment ago: its first attempt
    /// needs no fenced check of its own (`before_call`).
    just_planned: Option<Value>,
    /// Set while the key is new and not stored yet: what its first phase inserts with its
    /// writes. No one else can see the key until then.
    new: Option<Box<NewKey>>,
}

/// A key the claim found absent, as its first phase stores it.
#[derive(Debug)]
struct NewKey {
    account_id: String,
    key: String,
    fingerprint: Fingerprint,
    method: String,
    path: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.engine.forget(self.key_id, self.token);
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key_id", &self.key_id)
            .field("point", &self.point)
            .field("attempts", &self.attempts)
            .field("operation", &self.operation)
            .finish_non_exhaustive()
    }
}

/// What a phase did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<P> {
    /// Moved the key to this recovery point.
    Next(P),
    /// Moved the key to this recovery point, which makes a foreign call, and froze that call: the
    /// value is stored with the key and handed back by [`Lease::before_call`] to every attempt,
    /// by any process. Also used to stay at a point with a new plan.
    Call(P, Value),
    /// Stored this final response.
    Finish(StoredResponse),
}

impl Lease {
    /// The key's row id; local records created by the operation may refer to it.
    pub fn key_id(&self) -> i64 {
        self.key_id
    }

    /// The operation's name.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The operation's input, as the first request stored it.
    pub fn params(&self) -> &Value {
        &self.params
    }

    /// The first request's id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// How many times the key has been claimed (1 for a new key).
    pub fn attempts(&self) -> i32 {
        self.attempts
    }

    /// The recovery point the key is at, as the operation's enum. An unknown name is an error.
    pub fn point<P: RecoveryPoint>(&self) -> Result<P, IdemError> {
        P::from_name(&self.point).ok_or_else(|| IdemError::UnknownRecoveryPoint(self.point.clone()))
    }

    /// The final response, once a phase stored it.
    pub fn finished(&self) -> Option<&StoredResponse> {
        self.finished.as_ref()
    }

    /// Runs one atomic phase: one transaction that does the caller's writes and moves the key to
    /// the next recovery point or stores the final response, fenced on this lease. If the fence
    /// refuses, or anything fails, the whole phase rolls back. Serialization failures and
    /// deadlocks run the phase again (so `work` may run more than once; it only touches the
    /// database, never the outside world).
    ///
    /// The first phase of a new key also stores the key, first in the same transaction (so that
    /// `work` may write rows that refer to it): if another request stored the same key first, the
    /// insert waits for it on the unique index, the phase rolls back and fails with
    /// [`PhaseError::Superseded`].
    pub async fn phase<P, E, F>(&mut self, mut work: F) -> Result<Step<P>, PhaseError<E>>
    where
        P: RecoveryPoint,
        F: for<'t> FnMut(&'t mut PgConnection) -> BoxFuture<'t, Result<Step<P>, PhaseError<E>>>,
    {
        let engine = self.engine.clone();
        let _storing = engine.storing_new(self.new.is_some())?;
        let span = self.phase_span();
        let mut tries = 0;
        loop {
            let attempt = self.phase_once(&mut work).instrument(span.clone()).await;
            if let Some(settled) = self.settle(attempt, &span, &mut tries).await {
                return settled.map(|(step, ())| step);
            }
        }
    }

    async fn phase_once<P, E, F>(&self, work: &mut F) -> Result<(Step<P>, ()), PhaseError<E>>
    where
        P: RecoveryPoint,
        F: for<'t> FnMut(&'t mut PgConnection) -> BoxFuture<'t, Result<Step<P>, PhaseError<E>>>,
    {
        if self.finished.is_some() {
            return Err(PhaseError::LeaseLost);
        }
        let mut tx = self.engine.pool.begin().await?;
        // A new key is stored first, holding the lease at its recovery point: a request with the
        // same key waits on the unique index before it writes anything, and `work` may write rows
        // that refer to the key. Dropping the transaction on an error rolls back everything.
        if self.new.is_some() {
            let store_new = self.fence_to(&self.point, None, None, true);
            store::commit(&mut *tx, &store_new).await.map_err(|err| self.fence_error(err))?;
        }
        let step = work(&mut tx).await?;
        let fence = self.fence_of(&step, false);
        store::commit(&mut *tx, &fence).await.map_err(|err| self.fence_error(err))?;
        tx.commit().await?;
        Ok((step, ()))
    }

    /// Runs one atomic phase as a single statement, which commits on its own: `statement` sends
    /// one statement that makes the operation's writes and calls `idem_commit($fence)` with the
    /// value it is given (a data-modifying CTE, say), and returns the key id `idem_commit`
    /// returned beside its own result. The step is decided beforehand. Otherwise as
    /// [`Lease::phase`]: `statement` may run more than once, and a new key is stored by it.
    pub async fn phase_in_one<P, E, T, F>(
        &mut self,
        step: Step<P>,
        mut statement: F,
    ) -> Result<T, PhaseError<E>>
    where
        P: RecoveryPoint,
        F: for<'t> FnMut(&'t PgPool, &'t Value) -> BoxFuture<'t, Result<(i64, T), PhaseError<E>>>,
    {
        let engine = self.engine.clone();
        let _storing = engine.storing_new(self.new.is_some())?;
        let span = self.phase_span();
        let fence = self.fence_of(&step, self.new.is_some());
        let mut tries = 0;
        loop {
            let attempt = async {
                if self.finished.is_some() {
                    return Err(PhaseError::LeaseLost);
                }
                match statement(&self.engine.pool, &fence).await {
                    Ok((key_id, made)) if key_id == self.key_id => Ok((step.clone(), made)),
                    Ok(_) => Err(PhaseError::Database(sqlx::Error::Protocol(
                        "a one-statement phase did not return its fence's key".into(),
                    ))),
                    Err(PhaseError::Database(err)) => Err(self.fence_error(err)),
                    Err(other) => Err(other),
                }
            }
            .instrument(span.clone())
            .await;
            if let Some(settled) = self.settle(attempt, &span, &mut tries).await {
                return settled.map(|(_, made)| made);
            }
        }
    }

    fn phase_span(&self) -> tracing::Span {
        tracing::info_span!("idem.phase", key_id = self.key_id, from = %self.point, to = tracing::field::Empty)
    }

    /// What one attempt at a phase comes to: `None` to run it again (a retryable database
    /// error, after a pause), else its result, with the lease moved along when it committed.
    async fn settle<P, E, T>(
        &mut self,
        attempt: Result<(Step<P>, T), PhaseError<E>>,
        span: &tracing::Span,
        tries: &mut u32,
    ) -> Option<Result<(Step<P>, T), PhaseError<E>>>
    where
        P: RecoveryPoint,
    {
        match attempt {
            Err(PhaseError::Database(err))
                if is_retryable(&err) && *tries < self.engine.config.db_retries =>
            {
                *tries += 1;
                self.engine.observer.event(Event::DatabaseRetry);
                tokio::time::sleep(retry_pause(*tries)).await;
                None
            }
            Err(PhaseError::LeaseLost) => {
                self.engine.observer.event(Event::LeaseLost);
                tracing::warn!(parent: span, "lease lost: the phase was rolled back");
                Some(Err(PhaseError::LeaseLost))
            }
            Err(PhaseError::Superseded) => {
                // Not counted here: the claim that follows counts what the key turned out to be.
                tracing::debug!(parent: span, "another request stored the new key first: the phase was rolled back");
                Some(Err(PhaseError::Superseded))
            }
            Err(other) => Some(Err(other)),
            Ok((step, made)) => {
                self.just_planned = None;
                match &step {
                    Step::Next(point) => {
                        span.record("to", point.name());
                        self.point = point.name().to_owned();
                    }
                    Step::Call(point, plan) => {
                        span.record("to", point.name());
                        self.point = point.name().to_owned();
                        self.just_planned = Some(plan.clone());
                    }
                    Step::Finish(response) => {
                        span.record("to", FINISHED);
                        self.point = FINISHED.to_owned();
                        self.finished = Some(response.clone());
                        self.engine.observer.event(Event::Finished);
                    }
                }
                Some(self.stored().await.map(|()| (step, made)))
            }
        }
    }

    /// After a commit that may have stored a new key: the key is stored from now on. The database
    /// granted the lease with it, so a process stopping meanwhile gives it back at once.
    async fn stored<E>(&mut self) -> Result<(), PhaseError<E>> {
        if self.new.take().is_none() {
            return Ok(());
        }
        // The hang-up tests stall here: a caller that goes away from now on must not take the
        // lease with it.
        crate::failpoint(|| "idem.claim.inserted".to_owned()).await;
        if self.finished.is_none() && self.engine.is_closed() {
            self.engine.give_back(self.key_id, self.token, "the server was stopping").await;
            return Err(PhaseError::LeaseLost);
        }
        Ok(())
    }

    /// The value `idem_commit` takes to end a phase with `step` (see its migration); with
    /// `store_new`, it inserts the new key rather than moving a stored one.
    fn fence_of<P: RecoveryPoint>(&self, step: &Step<P>, store_new: bool) -> Value {
        match step {
            Step::Next(next) => self.fence_to(next.name(), None, None, store_new),
            Step::Call(next, plan) => self.fence_to(next.name(), Some(plan), None, store_new),
            Step::Finish(response) => self.fence_to(FINISHED, None, Some(response), store_new),
        }
    }

    fn fence_to(
        &self,
        next: &str,
        plan: Option<&Value>,
        response: Option<&StoredResponse>,
        store_new: bool,
    ) -> Value {
        let response = response.map(|response| {
            json!({
                "status": response.status,
                "headers": response.headers,
                "body": hex(&response.body),
            })
        });
        let new = self.new.as_ref().filter(|_| store_new).map(|new| {
            json!({
                "account_id": new.account_id,
                "key": new.key,
                "fingerprint": hex(new.fingerprint.as_bytes()),
                "method": new.method,
                "path": new.path,
                "request_id": self.request_id,
                "operation": self.operation,
                "params": self.params,
            })
        });
        json!({
            "key_id": self.key_id,
            "token": self.token,
            "expected": self.point,
            "lease_ms": self.engine.config.lease_ms(),
            "next": next,
            "plan": plan,
            "response": response,
            "new": new,
        })
    }

    /// What a failure of the fence means: the lease is lost (`IL001`), the new key was stored by
    /// another request first (a unique violation on the key), or a database error.
    fn fence_error<E>(&self, err: sqlx::Error) -> PhaseError<E> {
        let Some(db) = err.as_database_error() else { return PhaseError::Database(err) };
        match db.code().as_deref() {
            Some(LEASE_LOST) => PhaseError::LeaseLost,
            Some("23505")
                if self.new.is_some()
                    && db.constraint() == Some("idempotency_keys_account_key") =>
            {
                PhaseError::Superseded
            }
            _ => PhaseError::Database(err),
        }
    }

    /// Before anything but a phase acts on a new key: stores it at its recovery point, holding
    /// the lease, in a statement of its own, so that the key is in flight for everyone before
    /// anything happens outside.
    async fn store_new(&mut self) -> Result<(), Interrupted> {
        if self.new.is_none() {
            return Ok(());
        }
        let engine = self.engine.clone();
        let _storing = engine
            .storing_new(true)
            .map_err(|err: PhaseError<IdemError>| Interrupted::from(err))?;
        let fence = self.fence_to(&self.point, None, None, true);
        let stored = self
            .engine
            .retrying(|| async {
                match store::commit(&self.engine.pool, &fence).await {
                    Ok(_) => Ok(Ok(())),
                    Err(err) => match self.fence_error::<IdemError>(err) {
                        PhaseError::Database(err) => Err(IdemError::Database(err)),
                        other => Ok(Err(Interrupted::from(other))),
                    },
                }
            })
            .await?;
        stored?;
        self.stored::<IdemError>().await.map_err(Interrupted::from)
    }

    /// Right before a foreign call: makes sure this lease still holds the key at its recovery
    /// point (fenced, so a holder that lost the key stops here, before acting outside) and
    /// extends the lease; answers the call planned at the point (`None` for a key planned by a
    /// release that did not freeze its calls). Right after this lease's own phase planned the
    /// call, that commit was the check, and no round trip is made.
    pub async fn before_call(&mut self) -> Result<Option<Value>, Interrupted> {
        // Not when the process is stopping: `release_held` may have given the lease back since.
        if let Some(plan) = self.just_planned.take()
            && !self.engine.is_closed()
        {
            return Ok(Some(plan));
        }
        self.store_new().await?;
        let lease_ms = self.engine.config.lease_ms();
        let checked = self
            .engine
            .retrying(|| async {
                Ok(store::before_call(
                    &self.engine.pool,
                    self.key_id,
                    self.token,
                    &self.point,
                    lease_ms,
                )
                .await?)
            })
            .await?;
        match checked {
            Some(plan) => Ok(plan),
            None => {
                self.engine.observer.event(Event::LeaseLost);
                tracing::warn!(key_id = self.key_id, recovery_point = %self.point, "lease lost before a foreign call: not calling");
                Err(Interrupted::LeaseLost)
            }
        }
    }

    /// Before a foreign call that is not the planned one (a lookup at the processor): makes sure,
    /// fenced, that this lease still holds the key at its recovery point, and extends it, so that
    /// each foreign call starts with a whole lease ahead of it. A new key not stored yet is
    /// stored first, at its recovery point ([`Interrupted::Superseded`] if another request stored
    /// it first), as before any foreign call.
    pub async fn renew(&mut self) -> Result<(), Interrupted> {
        self.just_planned = None;
        self.before_call().await.map(|_| ())
    }

    /// For an operation that cannot learn what its planned call did, and found nothing where
    /// the call's object would be: marks the outcome unresolved (the first time) and answers for
    /// how long it has been, by the database clock. Anything the call made was made before the
    /// first such answer, so once this outlives the call and the lookup's lag, "nothing" is the
    /// truth. A new plan (the next generation) clears the mark. Fenced (a key not stored yet, which
    /// made no call, reads as a lost lease).
    pub async fn unresolved_for(&self) -> Result<Duration, Interrupted> {
        let seconds = self
            .engine
            .retrying(|| async {
                Ok(store::unresolved_for(&self.engine.pool, self.key_id, self.token).await?)
            })
            .await?
            .ok_or(Interrupted::LeaseLost)?;
        Ok(Duration::from_secs_f64(seconds.max(0.0)))
    }

    /// Flags the key for a person: no one drives it automatically again. Fenced on this lease.
    pub async fn flag(mut self, reason: &str) {
        if self.store_new().await.is_err() {
            // Stored by another request first, or not at all: not ours to flag.
            return;
        }
        match store::flag(&self.engine.pool, self.key_id, self.token, reason).await {
            Ok(true) => {
                self.engine.observer.event(Event::Flagged);
                tracing::error!(key_id = self.key_id, recovery_point = %self.point, reason, "an idempotency key needs a person");
            }
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(key_id = self.key_id, error = %err, "could not flag an idempotency key; it is retried after its lease")
            }
        }
    }

    /// Gives the key back to be driven again after `retry_in`, not sooner (see
    /// `Interrupted::Waiting`).
    pub async fn release_for(self, reason: &str, retry_in: Duration) {
        let retry_in_ms = i64::try_from(retry_in.as_millis()).unwrap_or(i64::MAX);
        match store::release(&self.engine.pool, self.key_id, self.token, reason, retry_in_ms).await
        {
            Ok(true) => self.engine.observer.event(Event::Released),
            Ok(false) => {}
            // The lease then simply expires, and the key is resumed after it.
            Err(err) => {
                tracing::warn!(key_id = self.key_id, error = %err, "could not release an idempotency key")
            }
        }
    }

    /// Gives the key back after a transient failure: it stays at its recovery point, unlocked, so
    /// that a retry with the same key resumes at once and the completer after a back-off.
    pub async fn release(self, reason: &str) {
        let delay = self.engine.config.retry_delay(self.attempts);
        self.release_for(reason, delay).await;
    }
}

/// How an operation step was interrupted.
#[derive(Debug, thiserror::Error)]
pub enum Interrupted {
    /// The lease was taken over; stop, touch nothing. The new holder answers.
    #[error("the lease on the idempotency key was lost")]
    LeaseLost,
    /// The key was new when this request claimed it, and another request with the same key
    /// stored it first: nothing of this attempt was stored. Claim again to learn what the key
    /// is now (in flight, used for another request, or finished).
    #[error("another request stored the idempotency key first")]
    Superseded,
    /// No automatic retry may finish this operation (the processor's answer cannot be
    /// reconciled with ours); the key is flagged for a person.
    #[error("needs a person: {reason}")]
    NeedsHuman {
        /// Why, for logs and the key's `last_error`; never shown to clients.
        reason: String,
    },
    /// Not a failure: the operation waits for something outside to settle (the processor's
    /// lookups to catch up with its writes) and can say when to look again. The key is released
    /// at its recovery point and due again after `retry_in`; a client is told the same.
    #[error("{detail}")]
    Waiting {
        /// What it waits for, for logs and the key's `last_error`.
        detail: String,
        /// When to look again.
        retry_in: Duration,
    },
    /// Something outside failed in a way that may pass (the processor is unavailable, the
    /// database is away). The key is released at its recovery point.
    #[error("{detail}")]
    Transient {
        /// Which kind of failure.
        kind: TransientKind,
        /// What happened, for logs and the key's `last_error`; never shown to clients.
        detail: String,
    },
}

/// Kinds of transient failure, which the HTTP edge answers differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransientKind {
    /// The card processor could not be reached or failed: `503 processor_unavailable`.
    Processor,
    /// Anything else, such as the database: `500 internal_error`.
    Internal,
}

impl<E: fmt::Display> From<PhaseError<E>> for Interrupted {
    fn from(err: PhaseError<E>) -> Self {
        match err {
            PhaseError::LeaseLost => Self::LeaseLost,
            PhaseError::Superseded => Self::Superseded,
            PhaseError::Database(err) => Self::Transient {
                kind: TransientKind::Internal,
                detail: format!("database: {err}"),
            },
            PhaseError::Operation(err) => {
                Self::Transient { kind: TransientKind::Internal, detail: err.to_string() }
            }
        }
    }
}

impl From<IdemError> for Interrupted {
    fn from(err: IdemError) -> Self {
        match err {
            IdemError::LeaseLost => Self::LeaseLost,
            other => Self::Transient { kind: TransientKind::Internal, detail: other.to_string() },
        }
    }
}

/// A multi-step operation written against the engine. `step` runs from the given recovery
/// point to the next one (or to the final response) and returns; `drive` calls it until the key
/// is finished. The same code serves a request and the completer.
pub trait Operation: Send + Sync {
    /// The operation's recovery points.
    type Point: RecoveryPoint;

    /// Runs the step that starts at `at`: optionally a foreign call (with no transaction open),
    /// then one `lease.phase`.
    fn step(
        &self,
        lease: &mut Lease,
        at: Self::Point,
    ) -> impl Future<Output = Result<(), Interrupted>> + Send;
}

/// Drives `operation` from the lease's recovery point to a final response. On a transient
/// failure the key is released at its recovery point and the failure returned; on a lost lease
/// nothing is touched.
pub async fn drive<O: Operation>(
    operation: &O,
    mut lease: Lease,
) -> Result<StoredResponse, Interrupted> {
    loop {
        if let Some(response) = lease.finished() {
            return Ok(response.clone());
        }
        let at = match lease.point::<O::Point>() {
            Ok(at) => at,
            Err(err) => {
                let interrupted = Interrupted::from(err);
                lease.release(&interrupted.to_string()).await;
                return Err(interrupted);
            }
        };
        match operation.step(&mut lease, at).await {
            Ok(()) => {
                // Right after a phase committed: the crash tests stop the process here.
                crate::failpoint(|| format!("{}.after_phase.{}", lease.operation, lease.point))
                    .await;
            }
            Err(Interrupted::LeaseLost) => return Err(Interrupted::LeaseLost),
            // Nothing of this attempt was stored: nothing to release.
            Err(Interrupted::Superseded) => return Err(Interrupted::Superseded),
            Err(Interrupted::NeedsHuman { reason }) => {
                lease.flag(&reason).await;
                return Err(Interrupted::NeedsHuman { reason });
            }
            Err(Interrupted::Waiting { detail, retry_in }) => {
                tracing::info!(
                    key_id = lease.key_id,
                    recovery_point = at.name(),
                    retry_in_ms = retry_in.as_millis() as u64,
                    detail,
                    "operation waiting; the key stays at its recovery point"
                );
                lease.release_for(&detail, retry_in).await;
                return Err(Interrupted::Waiting { detail, retry_in });
            }
            Err(transient) => {
                tracing::warn!(key_id = lease.key_id, recovery_point = at.name(), error = %transient, "operation interrupted; the key stays at its recovery point");
                lease.release(&transient.to_string()).await;
                return Err(transient);
            }
        }
    }
}

/// Boxes a phase's future; spares callers the pinning noise.
pub fn boxed<'t, T>(future: impl Future<Output = T> + Send + 't) -> BoxFuture<'t, T> {
    Box::pin(future)
}
