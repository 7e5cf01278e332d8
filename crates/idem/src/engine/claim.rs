//! Claims: a request's claim of a key (a read, and a takeover when the key is free), the
//! completer's `take_due`, and the reaper.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;
use uuid::Uuid;

use super::answers::{Answer, KeptAnswer};
use super::lease::{Lease, NewKey};
use super::operation::{ClaimArgs, FirstStatement, UNMADE, corrupt};
use super::{DB_RETRY, Engine, STARTED};
use crate::error::{IdemError, PhaseError, gave_up, is_retryable, stored_meanwhile};
use crate::fingerprint::Fingerprint;
use crate::kept::{Kept, connection_lost};
use crate::key::IdempotencyKey;
use crate::observe::Event;
use crate::response::StoredResponse;
use crate::store::{self, Claimed, Claiming, Lookup, Seen};

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
pub struct Open(Opening);

#[derive(Debug)]
enum Opening {
    /// No such key: the id reserved for it.
    New(i64),
    /// An unfinished key, as read.
    Stored(Box<store::KeyRow>),
}

/// What a claim that runs the first phase found ([`Engine::claim_first`]).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // matched at once by the caller, as `Claim`
pub enum First<T> {
    /// A replay or a refusal (never `Claim::Acquired`).
    Decided(Claim),
    /// An unfinished key whose lease is free or expired: [`Engine::take`] takes it, and the
    /// operation is driven from its recovery point.
    Open(Open),
    /// The key was new, and the first phase stored it with its writes: the lease, at the phase's
    /// recovery point, and what the phase returned.
    Ran(Lease, T),
}

/// An engine error as a phase's.
fn phase_error<E>(err: IdemError) -> PhaseError<E> {
    match err {
        IdemError::Database(err) => PhaseError::Database(err),
        IdemError::LeaseLost => PhaseError::LeaseLost,
        other => corrupt(other),
    }
}

impl Engine {
    /// Claims a key: one round trip for a new key, a replay, a mismatch or a key in use; a
    /// second one to take over an unfinished key whose lease is free or expired. The same as
    /// [`Engine::read_claim`] and then [`Engine::take`], reading again when the take missed.
    pub async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, IdemError> {
        let span = tracing::debug_span!("idem.claim", operation = request.operation);
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
    pub async fn read_claim(&self, request: &ClaimRequest<'_>) -> Result<Read, IdemError> {
        let span = tracing::debug_span!("idem.claim", operation = request.operation);
        self.read_key(request).instrument(span).await
    }

    /// A claim's second half: takes the key its read found open, new (no statement: the first
    /// phase stores it) or unfinished (the takeover's compare-and-swap). `None` when another
    /// request took or finished the key between the read and the take: claim again.
    pub async fn take(
        &self,
        open: Open,
        request: &ClaimRequest<'_>,
    ) -> Result<Option<Claim>, IdemError> {
        let span = tracing::debug_span!("idem.claim", operation = request.operation);
        self.take_key(open, request).instrument(span).await
    }

    /// Runs the claim's read on a kept connection. One that had served before and fails as a
    /// connection (the server ended its session while it sat idle: a restart) is closed, and the
    /// read is sent again, on the next kept connection or a new one: safe, because the statement
    /// only reads (an id it reserved from the sequence is simply not used).
    async fn read_on(&self, kept: &Arc<Kept>, lookup: &Lookup) -> Result<store::Read, IdemError> {
        let mut tries = 0;
        loop {
            let mut lent = kept.lend().await?;
            let reused = lent.reused();
            let read = store::read(lent.connection(), lookup).await;
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

    async fn read_key(&self, request: &ClaimRequest<'_>) -> Result<Read, IdemError> {
        if let Some(claim) = self.kept_answer(request).await {
            return Ok(Read::Decided(claim));
        }
        let lookup = Lookup {
            account_id: request.account_id.to_owned(),
            credential: request.credential.map(<[u8]>::to_vec),
            key: request.key.as_str().to_owned(),
        };
        let read = match self.claim_connections() {
            Some(kept) => self.retrying(|| self.read_on(kept, &lookup)).await?,
            None => self.retrying(|| store::read(&self.pool, &lookup)).await?,
        };
        self.decide(request, read)
    }

    /// A replay or a mismatch answered from the answers kept in memory (`answers.rs`), when they
    /// may answer this request; `None` when the key must be read.
    pub async fn kept_answer(&self, request: &ClaimRequest<'_>) -> Option<Claim> {
        let kept = self.answers.answer(
            self,
            request.account_id,
            request.credential,
            request.key.as_str(),
            &request.fingerprint,
        );
        let kept = kept.await?;
        self.observer.event(Event::AnsweredFromMemory);
        Some(match kept {
            KeptAnswer::Replay(response) => {
                self.observer.event(Event::Replayed);
                Claim::Replay(response)
            }
            KeptAnswer::Mismatch { method, path } => {
                self.observer.event(Event::Mismatch);
                Claim::Mismatch { method, path }
            }
        })
    }

    /// What a read of the key decides for `request`.
    fn decide(&self, request: &ClaimRequest<'_>, read: store::Read) -> Result<Read, IdemError> {
        if let Some(digest) = request.credential {
            let live = !matches!(read.seen, Seen::Unauthenticated);
            let live = live.then_some((request.account_id, read.version));
            self.answers.credential_seen(digest, live);
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
                self.answers.keep(request.account_id, request.key.as_str(), answer, now_us);
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

    /// A claim whose read is the operation's first phase: one statement that reads the key and,
    /// when the key is new, stores it with the phase's writes, so that a new key costs two
    /// statements in all where [`Engine::claim`] and the phase cost three, and a replay, a
    /// mismatch or a key in use still cost one. Answers a replay or a refusal (`Decided`), an
    /// unfinished key to take over ([`Engine::take`], then drive it from its recovery point), or
    /// the lease of the new key at the phase's point with what the phase returned.
    ///
    /// Answers kept in memory are not consulted here: ask [`Engine::kept_answer`] first (it
    /// writes nothing, so it may run where a client's hang-up cuts it off; this may not).
    ///
    /// A request that stores the same key meanwhile makes the statement fail on the unique index;
    /// it is sent again and reads that key. The statement runs on the claim's connections, its
    /// waits bounded by `claim_timeout`; a wait given up on is followed by a plain read, which may
    /// still answer a replay or a refusal. A process that is stopping takes no key (it answers what
    /// a plain read decides, `InUse` for a key it would take), and gives back a key stored while it
    /// began to stop (`PhaseError::LeaseLost`); a key stored by a statement whose answer was lost
    /// is given back at once.
    pub async fn claim_first<S: FirstStatement>(
        &self,
        request: &ClaimRequest<'_>,
        statement: &mut S,
    ) -> Result<First<S::Output>, PhaseError<S::Error>> {
        let span = tracing::debug_span!("idem.claim", operation = request.operation);
        self.claim_first_once(request, statement).instrument(span).await
    }

    async fn claim_first_once<S: FirstStatement>(
        &self,
        request: &ClaimRequest<'_>,
        statement: &mut S,
    ) -> Result<First<S::Output>, PhaseError<S::Error>> {
        // Counted until the lease is recorded as held (or given back), as a takeover's. A process
        // that is stopping takes no key, but still answers what a read of it decides.
        let Some(_granting) = self.granting() else {
            return match self.read_key(request).await.map_err(phase_error)? {
                Read::Decided(claim) => Ok(First::Decided(claim)),
                Read::Open(_) => Ok(First::Decided(Claim::InUse)),
            };
        };
        let mut lease = self.new_lease(request, 0);
        let step = statement.step();
        let fence = lease.fence_of(&step, true)?.without_id();
        let claim = ClaimArgs {
            account: request.account_id,
            key: request.key.as_str(),
            credential: request.credential,
            fence: &fence,
        };
        let mut tries = 0;
        let sent = loop {
            match self.send_first(statement, claim).await {
                Err(PhaseError::Database(err))
                    if is_retryable(&err) && tries < self.config.db_retries =>
                {
                    tries += 1;
                    // The key stored meanwhile is committed: the next run reads it at once.
                    if !stored_meanwhile(&err) {
                        self.observer.event(Event::DatabaseRetry);
                        tokio::time::sleep(DB_RETRY.delay(tries)).await;
                    }
                }
                sent => break sent,
            }
        };
        let (claimed, made) = match sent {
            Ok(sent) => sent,
            // The statement waited longer than a claim may (a lock on a table it writes, held by
            // a migration, say) and stored nothing. A read takes no such lock: it may still
            // answer a replay or a refusal; a key to take waits for a retry.
            Err(PhaseError::Database(err)) if gave_up(&err) => {
                return match self.read_key(request).await.map_err(phase_error)? {
                    Read::Decided(claim) => Ok(First::Decided(claim)),
                    Read::Open(_) => Err(PhaseError::Database(err)),
                };
            }
            Err(err) => return Err(self.unheld(request, &lease, err).await),
        };
        let claiming = match claimed.claiming() {
            Ok(claiming) => claiming,
            Err(err) => return Err(self.unheld(request, &lease, corrupt(err)).await),
        };
        let (id, version) = match claiming {
            Claiming::Stored { id, version } => (id, version),
            Claiming::Read(read) => {
                return match self.decide(request, read).map_err(corrupt)? {
                    Read::Decided(claim) => Ok(First::Decided(claim)),
                    // The statement stores a key it finds absent; it reserves no id.
                    Read::Open(Open(Opening::New(_))) => Err(corrupt(IdemError::Corrupt(
                        "a first statement that found its key absent and stored nothing",
                    ))),
                    Read::Open(open) => Ok(First::Open(open)),
                };
            }
        };
        lease.key_id = id;
        if !self.hold_granted(id, lease.token).await {
            return Err(PhaseError::LeaseLost);
        }
        let Some(made) = made else {
            return Err(self.unheld(request, &lease, corrupt(UNMADE)).await);
        };
        if let (Some(digest), Some(version)) = (request.credential, version) {
            self.answers.credential_seen(digest, Some((request.account_id, version)));
        }
        self.observer.event(Event::Claimed);
        lease.moved(&step, &lease.phase_span());
        lease.stored().await?;
        // Right after the first phase committed, as `drive` after every other phase: the crash
        // tests stop the process here.
        crate::failpoint(|| format!("{}.after_phase.{}", lease.operation, lease.point)).await;
        Ok(First::Ran(lease, made))
    }

    /// After a first statement whose outcome this process cannot use (its connection failed as
    /// it ran, or its answer made no sense): the key it may have stored under this lease's token
    /// is given back at once, so that a retry resumes it rather than wait out the lease. An error
    /// the server answered needs nothing: the statement rolled back. When nothing is found, the
    /// statement may still be running in the server with its client gone: it is looked for once
    /// more when it must have ended (its waits are bounded by `claim_timeout`). Answers `err`.
    async fn unheld<E>(
        &self,
        request: &ClaimRequest<'_>,
        lease: &Lease,
        err: PhaseError<E>,
    ) -> PhaseError<E> {
        if matches!(&err, PhaseError::Database(db) if db.as_database_error().is_some()) {
            return err;
        }
        let (account, key) = (request.account_id.to_owned(), request.key.as_str().to_owned());
        let token = lease.token;
        if !self.give_back_unheld(&account, &key, token).await {
            let engine = self.clone();
            let ended = self.config.claim_timeout * 2 + Duration::from_millis(100);
            tokio::spawn(async move {
                tokio::time::sleep(ended).await;
                engine.give_back_unheld(&account, &key, token).await;
            });
        }
        err
    }

    /// Gives back the key `token` holds, found by its account and key: whether one was found.
    async fn give_back_unheld(&self, account: &str, key: &str, token: Uuid) -> bool {
        let reason = "the claim's first phase ended without an answer";
        match store::release_unheld(&self.pool, account, key, token, reason).await {
            Ok(released) => {
                if released {
                    self.observer.event(Event::Released);
                    tracing::warn!(
                        "a key whose first phase ended without an answer was given back"
                    );
                }
                released
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not give back a key whose first phase ended without an answer; it is resumed when its lease expires");
                false
            }
        }
    }

    /// Sends a first statement once, on a kept claim connection (its statement and lock waits
    /// bounded by `claim_timeout`, as a claim's read) or a pooled one.
    async fn send_first<S: FirstStatement>(
        &self,
        statement: &mut S,
        claim: ClaimArgs<'_>,
    ) -> Result<(Claimed, Option<S::Output>), PhaseError<S::Error>> {
        let Some(kept) = self.claim_connections() else {
            let mut pooled = self.pool.acquire().await?;
            return statement.run(&mut pooled, claim).await;
        };
        let mut lent = kept.lend().await?;
        let sent = statement.run(lent.connection(), claim).await;
        lent.give_back(match &sent {
            Err(PhaseError::Database(err)) => Some(err),
            _ => None,
        });
        sent
    }

    /// The lease of a new key, not stored yet: its first phase stores it under `key_id` (`0`
    /// until the database gives it one).
    fn new_lease(&self, request: &ClaimRequest<'_>, key_id: i64) -> Lease {
        let new = NewKey {
            account_id: request.account_id.to_owned(),
            key: request.key.as_str().to_owned(),
            fingerprint: request.fingerprint,
            method: request.method.to_owned(),
            path: request.path.to_owned(),
        };
        Lease {
            engine: self.clone(),
            key_id,
            token: Uuid::new_v4(),
            point: STARTED.to_owned(),
            attempts: 1,
            operation: request.operation.to_owned(),
            params: request.params.clone(),
            request_id: request.request_id.to_owned(),
            finished: None,
            just_planned: None,
            new: Some(Box::new(new)),
        }
    }

    async fn take_key(
        &self,
        open: Open,
        request: &ClaimRequest<'_>,
    ) -> Result<Option<Claim>, IdemError> {
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

    /// The completer's claim: up to `limit` unfinished keys whose lease is free or expired and
    /// whose next attempt is due, each leased to this process. The completer asks for one key at
    /// a time and drives it before asking again: a key leased while it waits behind others can
    /// see its lease run out before its turn comes. A key the completer has already run
    /// `max_attempts` times, or created longer than `window` ago, is flagged for a person
    /// instead (returned as `Due::Flagged`) and never retried automatically. Only the
    /// completer's own runs count against `max_attempts`: a client may retry a key (resume or
    /// take it over) as often as it likes without spending the completer's budget.
    ///
    /// Only keys of the `operations` the caller can drive are taken: during a rolling deploy, a
    /// completer of the older release leaves a key of an operation only the newer one knows to a
    /// completer that knows it, rather than taking it and finding nothing to do but flag it. A
    /// key of an operation no release knows any more is flagged by the reaper once it is older
    /// than the retention ([`Engine::reap`]).
    pub async fn take_due(
        &self,
        limit: u32,
        max_attempts: u32,
        window: Duration,
        operations: &[&str],
    ) -> Result<Vec<Due>, IdemError> {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let lease_ms = self.config.lease_ms();
        // As a claim's takeover: counted until every lease is recorded as held (or given back).
        let Some(_granting) = self.granting() else { return Ok(Vec::new()) };
        let rows = self
            .retrying(|| async {
                Ok(store::take_due(&self.pool, i64::from(limit), lease_ms, window_ms, operations)
                    .await?)
            })
            .await?;
        let mut due = Vec::with_capacity(rows.len());
        for row in rows {
            let reason = if row.too_old {
                Some("older than the processor's idempotency window".to_owned())
            } else if u32::try_from(row.completer_attempts).unwrap_or(u32::MAX) > max_attempts {
                Some(format!("the completer gave up after {max_attempts} attempts"))
            } else {
                None
            };
            if let Some(reason) = reason {
                // A failure here must not drop the batch: the leases taken with this key would
                // be neither driven nor given back until they expire.
                let flagged = self
                    .retrying(|| async {
                        Ok(store::flag(&self.pool, row.id, row.token, &reason).await?)
                    })
                    .await;
                match flagged {
                    Ok(true) => {}
                    // The lease ran out between the take and the flag, and another taker holds
                    // the key now: it is theirs to drive, not a person's.
                    Ok(false) => {
                        tracing::info!(
                            key_id = row.id,
                            reason,
                            "a key due for a person was taken by another request first"
                        );
                        continue;
                    }
                    Err(err) => {
                        tracing::warn!(
                            key_id = row.id,
                            error = %err,
                            "could not flag a key for a person; it is taken again when its lease expires"
                        );
                        continue;
                    }
                }
                self.observer.event(Event::Flagged);
                tracing::error!(
                    key_id = row.id,
                    recovery_point = %row.recovery_point,
                    attempts = row.attempts,
                    completer_attempts = row.completer_attempts,
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

    /// The reaper: deletes up to `limit` keys completed longer than the engine's `retention` ago
    /// (the one its answers kept in memory end with). Unfinished keys are never deleted; those
    /// created longer than `retention` ago are flagged for a person instead.
    pub async fn reap(&self, limit: u32) -> Result<Reaped, IdemError> {
        let retention_ms = i64::try_from(self.config.retention.as_millis()).unwrap_or(i64::MAX);
        let deleted = store::reap(&self.pool, i64::from(limit), retention_ms).await?;
        let flagged = store::flag_stale(&self.pool, retention_ms).await?;
        for _ in 0..flagged {
            self.observer.event(Event::Flagged);
        }
        Ok(Reaped { deleted, flagged })
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
