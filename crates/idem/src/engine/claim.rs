//! Claims: a request's claim of a key, a read that decides a replay, a mismatch or a key in use,
//! and a takeover when the key is unfinished and its lease free or expired.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;
use uuid::Uuid;

use super::give_back::{GiveBack, Holding};
use super::lease::Lease;
use super::replay_cache::{Answer, CachedAnswer};
use super::{Engine, STARTED};
use crate::connections::{SideConnections, connection_lost};
use crate::error::IdemError;
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::observe::Event;
use crate::response::StoredResponse;
use crate::store::{self, Seen};

/// A request with an idempotency key, as the engine claims it and as a new key stores it: built
/// once, by the caller that received it, and carried as is into the claim and the lease of a new
/// key. Cheap to clone (its text is shared).
#[derive(Debug, Clone)]
pub struct Request {
    /// The scope of the key.
    pub account_id: Arc<str>,
    /// The SHA-256 digest of the API key the request presents, when the caller has not checked
    /// it yet: the claim checks, in the same statement, that it is a live key of `account_id`,
    /// and claims and reads nothing when it is not (`Claim::Unauthenticated`). `None` when the
    /// caller authenticated the request itself.
    pub credential: Option<Arc<[u8]>>,
    /// The key.
    pub key: IdempotencyKey,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// For the mismatch message.
    pub method: Arc<str>,
    /// For the mismatch message.
    pub path: Arc<str>,
    /// Kept with the key: stored problem bodies carry the first request's id.
    pub request_id: Arc<str>,
    /// The operation's name, so the completer knows what to resume.
    pub operation: Arc<str>,
    /// The operation's input, so the completer can resume without the HTTP request.
    pub params: Arc<Value>,
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

/// What a claim's read found ([`Engine::read_claim`]).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // matched at once by the caller, as `Claim`
pub enum Read {
    /// The claim is decided without a lease: a replay or a refusal (never `Claim::Acquired`).
    Decided(Claim),
    /// A new key, or an unfinished one whose lease is free or expired: [`Engine::take`] takes it.
    Open(Open),
}

/// A key a claim's read found open to the request; [`Engine::take`] takes it.
#[derive(Debug)]
pub struct Open(pub(super) Opening);

#[derive(Debug)]
pub(super) enum Opening {
    /// No such key: the id reserved for it.
    New(i64),
    /// An unfinished key, as read.
    Stored(Box<store::KeyRow>),
}

impl Engine {
    /// Claims a key: one round trip for a new key, a replay, a mismatch or a key in use; a
    /// second one to take over an unfinished key whose lease is free or expired. The same as
    /// [`Engine::read_claim`] and then [`Engine::take`], reading again when the take missed.
    pub async fn claim(&self, request: &Request) -> Result<Claim, IdemError> {
        let span = tracing::debug_span!("idem.claim", operation = &*request.operation);
        async {
            for _ in 0..=self.config.db_retries {
                match self.read_key(request).await? {
                    Read::Decided(claim) => return Ok(claim),
                    Read::Open(open) => {
                        if let Some(claim) = self.take_key(open, request).await? {
                            return Ok(claim);
                        }
                    }
                }
            }
            Err(IdemError::Contended)
        }
        .instrument(span)
        .await
    }

    /// A claim's first half: one statement that reads the key (checking the credential on the
    /// way) and writes nothing, so that a caller may run it where it can be cut off (a request's
    /// own task, which a client hanging up cancels) and take the key with [`Engine::take`] where
    /// it cannot. A replay, a mismatch, a key in use cost this alone.
    pub async fn read_claim(&self, request: &Request) -> Result<Read, IdemError> {
        let span = tracing::debug_span!("idem.claim", operation = &*request.operation);
        self.read_key(request).instrument(span).await
    }

    /// A claim's second half: takes the key its read found open, new (no statement: the first
    /// phase stores it) or unfinished (the takeover's compare-and-swap). `None` when another
    /// request took or finished the key between the read and the take: claim again.
    pub async fn take(&self, open: Open, request: &Request) -> Result<Option<Claim>, IdemError> {
        let span = tracing::debug_span!("idem.claim", operation = &*request.operation);
        self.take_key(open, request).instrument(span).await
    }

    /// Runs the claim's read on a kept connection. One that had served before and fails as a
    /// connection (the server ended its session while it sat idle: a restart) is closed, and the
    /// read is sent again, on the next kept connection or a new one: safe, because the statement
    /// only reads (an id it reserved from the sequence is simply not used).
    async fn read_on(
        &self,
        kept: &Arc<SideConnections>,
        request: &Request,
    ) -> Result<store::Read, IdemError> {
        let mut tries = 0;
        loop {
            let mut lent = kept.lend().await?;
            let reused = lent.reused();
            let read = store::read(lent.connection(), request).await;
            let failed = match &read {
                Err(IdemError::Database(err)) => Some(err),
                _ => None,
            };
            let lost = failed.is_some_and(connection_lost);
            lent.give_back(failed);
            if !(lost && reused) || tries >= self.config.claim_connections {
                return read;
            }
            tries += 1;
            tracing::debug!("a claim connection was ended by the server; sending the claim again");
        }
    }

    pub(super) async fn read_key(&self, request: &Request) -> Result<Read, IdemError> {
        if let Some(claim) = self.cached_answer(request).await {
            return Ok(Read::Decided(claim));
        }
        let read = match self.claim_connections() {
            Some(kept) => self.retrying(|| self.read_on(kept, request)).await?,
            None => self.retrying(|| store::read(&self.pool, request)).await?,
        };
        self.decide(request, read)
    }

    /// A replay or a mismatch answered from the answers kept in memory (`replay_cache.rs`), when they
    /// may answer this request; `None` when the key must be read.
    pub async fn cached_answer(&self, request: &Request) -> Option<Claim> {
        let kept = self.replay_cache.answer(
            self,
            &request.account_id,
            request.credential.as_deref(),
            request.key.as_str(),
            &request.fingerprint,
        );
        let kept = kept.await?;
        self.observer.event(Event::AnsweredFromMemory);
        Some(match kept {
            CachedAnswer::Replay(response) => {
                self.observer.event(Event::Replayed);
                Claim::Replay(response)
            }
            CachedAnswer::Mismatch { method, path } => {
                self.observer.event(Event::Mismatch);
                Claim::Mismatch { method, path }
            }
        })
    }

    /// What a read of the key decides for `request`.
    pub(super) fn decide(&self, request: &Request, read: store::Read) -> Result<Read, IdemError> {
        if let Some(digest) = request.credential.as_deref() {
            let live = !matches!(read.seen, Seen::Unauthenticated);
            let live = live.then_some((&*request.account_id, read.version));
            self.replay_cache.credential_seen(digest, live);
        }
        let now_us = read.now_us;
        let row = match read.seen {
            Seen::Key(row) => row,
            Seen::Unauthenticated => return Ok(Read::Decided(Claim::Unauthenticated)),
            Seen::Absent(reserved) => return Ok(Read::Open(Open(Opening::New(reserved)))),
        };
        if row.fingerprint != request.fingerprint.as_bytes() {
            self.observer.event(Event::Mismatch);
            return Ok(Read::Decided(Claim::Mismatch {
                method: row.request_method,
                path: row.request_path,
            }));
        }
        if let Some(response) = row.response {
            self.observer.event(Event::Replayed);
            if let Some(completed_at_us) = row.completed_at_us {
                let answer = Answer {
                    fingerprint: request.fingerprint,
                    method: &row.request_method,
                    path: &row.request_path,
                    response: &response,
                    completed_at_us,
                };
                self.replay_cache.keep(&request.account_id, request.key.as_str(), answer, now_us);
            }
            return Ok(Read::Decided(Claim::Replay(response)));
        }
        if row.needs_human {
            return Ok(Read::Decided(Claim::NeedsHuman));
        }
        if row.lease_active {
            self.observer.event(Event::InUse);
            return Ok(Read::Decided(Claim::InUse));
        }
        Ok(Read::Open(Open(Opening::Stored(Box::new(row)))))
    }

    /// The lease of a new key, not stored yet: its first phase stores it under `key_id` (`0`
    /// until the database gives it one).
    pub(super) fn new_lease(&self, request: &Request, key_id: i64) -> Lease {
        Lease {
            engine: self.clone(),
            key_id,
            token: Uuid::new_v4(),
            point: STARTED.to_owned(),
            attempts: 1,
            operation: request.operation.to_string(),
            params: Value::clone(&request.params),
            request_id: request.request_id.to_string(),
            finished: None,
            just_planned: None,
            new: Some(Box::new(request.clone())),
        }
    }

    async fn take_key(&self, open: Open, request: &Request) -> Result<Option<Claim>, IdemError> {
        let row = match open.0 {
            // A new key: nothing is stored until the first phase commits, which inserts the key
            // with its own writes (`Lease::phase`, `Lease::phase_in_one`). The lease is this
            // request's alone until then, because no one else can see it.
            Opening::New(reserved) => {
                self.observer.event(Event::Claimed);
                let lease = self.new_lease(request, reserved);
                // A process that is stopping takes no new work (`release_held`).
                if !self.hold(lease.key_id, lease.token) {
                    return Ok(Some(Claim::InUse));
                }
                return Ok(Some(Claim::Acquired(lease)));
            }
            Opening::Stored(row) => row,
        };
        // Unfinished, so the read sent the operation's input.
        let params = row
            .request_params
            .clone()
            .ok_or(IdemError::Corrupt("an unfinished key read without its input"))?;
        // The stall tests stop here, between reading the row and taking it over.
        crate::failpoint(|| "idem.claim.before_take_over".to_owned()).await;
        // Counted until the lease is recorded as held, so that a shutdown meanwhile waits
        // for it and gives it back; a process that is stopping takes nothing over.
        let Some(_granting) = self.granting() else { return Ok(Some(Claim::InUse)) };
        let (window_ms, lease_ms) = (self.config.window_ms(), self.config.lease_ms());
        let token = Uuid::new_v4();
        let taken = self
            .retrying(|| async {
                // Bounded like a claim connection's: the row may be held by a stuck
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
                    &request.request_id,
                    window_ms,
                )
                .await?;
                tx.commit().await?;
                if crate::failpoint::answer_lost(|| "idem.claim.take_over.answer".to_owned()) {
                    let lost = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "lost");
                    return Err(IdemError::Database(sqlx::Error::Io(lost)));
                }
                Ok(taken)
            })
            .await;
        let taken = match taken {
            Ok(taken) => taken,
            Err(err) => return Err(self.not_taken(row.id, token, err).await),
        };
        match taken {
            store::TakeOver::Taken(point, attempts) => {
                let event =
                    if row.owner_token.is_some() { Event::TookOver } else { Event::Resumed };
                self.observer.event(event);
                tracing::info!(key_id = row.id, recovery_point = %point, attempts, ?event, "resuming an idempotency key");
                let Some(lease) = self.lease(row.id, token, point, attempts, &row, params).await
                else {
                    return Ok(Some(Claim::InUse));
                };
                crate::failpoint(|| "idem.claim.taken_over".to_owned()).await;
                Ok(Some(Claim::Acquired(lease)))
            }
            store::TakeOver::Flagged => {
                self.observer.event(Event::Flagged);
                tracing::error!(
                    key_id = row.id,
                    reason = "older than the processor's idempotency window",
                    "an idempotency key needs a person"
                );
                Ok(Some(Claim::NeedsHuman))
            }
            // Someone else took it or finished it between the read and the swap: read again.
            store::TakeOver::Missed => Ok(None),
        }
    }

    /// After a takeover whose outcome this process cannot know (its connection failed as it
    /// committed): the key it may have taken under `token` is given back at once, as a first
    /// statement's is, so that a retry resumes it instead of meeting `409` for a whole lease. An
    /// error the server answered needs nothing: the takeover rolled back. Answers `err`.
    async fn not_taken(&self, key_id: i64, token: Uuid, err: IdemError) -> IdemError {
        // The server answered (the takeover rolled back), or nothing was sent at all.
        let nothing_taken = matches!(&err, IdemError::Database(db)
            if db.as_database_error().is_some()
                || matches!(db, sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed));
        if nothing_taken {
            return err;
        }
        let holding = Holding::Stored { key_id };
        let reason = "the takeover ended without an answer".to_owned();
        let back = GiveBack { holding, token, reason, retry_in: Duration::ZERO };
        if self.give_back(back, true).await == Some(true) {
            tracing::warn!(key_id, "a key whose takeover ended without an answer was given back");
        }
        err
    }

    /// The lease the database just granted, or `None` when the process is stopping (it was
    /// given back already).
    pub(super) async fn lease(
        &self,
        key_id: i64,
        token: Uuid,
        point: String,
        attempts: i32,
        row: &store::KeyRow,
        params: Value,
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
            params,
            request_id: row.request_id.clone(),
            finished: None,
            just_planned: None,
            new: None,
        })
    }
}
