//! An operation's first phase as one statement that also claims its key
//! ([`Engine::claim_first`]): for a new key, the claim's read and the first phase are one
//! statement and one transaction, so a new key costs no read of its own.

use std::time::Duration;

use sqlx::PgConnection;
use tracing::Instrument;

use super::super::claim::{Claim, Open, Opening, Read, Request};
use super::super::give_back::{GiveBack, Holding};
use super::super::lease::Lease;
use super::super::phase::Step;
use super::super::{DB_RETRY, Engine, RecoveryPoint};
use crate::error::{IdemError, is_retryable, stored_meanwhile};
use crate::observe::Event;
use crate::store::{Claimed, Claiming, FenceRecord};

/// What an operation's first statement binds to claim its key ([`Engine::claim_first`]): its
/// first CTE is `SELECT idem_claim($a, $k, $c, $f) AS claimed`, with these four values in this
/// order.
#[derive(Debug, Clone, Copy)]
pub struct ClaimArgs<'a> {
    /// The key's account.
    pub account: &'a str,
    /// The key.
    pub key: &'a str,
    /// The API key's digest, when the claim checks it.
    pub credential: Option<&'a [u8]>,
    /// The fence: a new key's, which `idem_claim` stores when the key is absent, or a stored
    /// key's, which it moves (fenced on the lease).
    pub fence: &'a FenceRecord,
}

const UNMADE: IdemError =
    IdemError::Corrupt("a first statement that stored its key returned no rows");

/// What one sending of an operation's first statement found (`Engine::claim_first_once`).
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

impl Engine {
    /// A claim whose read is the operation's first phase, which ends with `step`: one statement
    /// (`send`) that reads the key and, when the key is new, stores it with the phase's writes,
    /// so that a new key costs two statements in all where [`Engine::claim`] and the phase cost
    /// three, and a replay, a mismatch or a key in use still cost one. Answers the claim, and
    /// what `send` returned when it stored the key (the lease is then at `step`'s point).
    ///
    /// `send` sends one statement whose first CTE calls `idem_claim` with the [`ClaimArgs`] it
    /// is given (`SELECT idem_claim($a, $k, $c, $f) AS claimed`), which makes its writes only
    /// from that CTE `WHERE (claimed).stored`, and returns the `idem_claimed` record it got,
    /// unopened, beside its rows (`None` when it stored nothing: then it wrote nothing). It may
    /// run more than once, so it decides the same way each time; it runs on a claim connection,
    /// under the rules of [`Lease::phase_in_one`]'s statement.
    ///
    /// An unfinished key found open is taken over ([`Engine::take`]), with no rows: its lease at
    /// the key's own recovery point, or what the take decided (in use, a person's). Taken by
    /// another request between the statement and the take, the key is claimed again, once;
    /// missed twice (each taker gave the key back at once), it is [`IdemError::Contended`].
    ///
    /// Answers kept in memory are not consulted here: ask [`Engine::cached_answer`] first (it
    /// writes nothing, so it may run where a client's hang-up cuts it off; this may not).
    ///
    /// A request that stores the same key meanwhile makes the statement fail on the unique index;
    /// it is sent again and reads that key. The statement runs on the claim's connections, its
    /// waits bounded by `claim_timeout`; a wait given up on is followed by a plain read, which may
    /// still answer a replay or a refusal. A process that is stopping takes no key (it answers what
    /// a plain read decides, `InUse` for a key it would take), and gives back a key stored while it
    /// began to stop ([`IdemError::LeaseLost`]); a key stored by a statement whose answer was lost
    /// is given back at once.
    pub async fn claim_first<P, T>(
        &self,
        request: &Request,
        step: Step<P>,
        send: impl AsyncFnOnce(
            &mut PgConnection,
            ClaimArgs<'_>,
        ) -> Result<(Claimed, Option<T>), IdemError>
        + Clone,
    ) -> Result<(Claim, Option<T>), IdemError>
    where
        P: RecoveryPoint,
    {
        for _ in 0..2 {
            let open = match self.claim_first_once(request, &step, &send).await? {
                First::Ran(lease, made) => return Ok((Claim::Acquired(lease), Some(made))),
                First::Decided(claim) => return Ok((claim, None)),
                First::Open(open) => open,
            };
            if let Some(claim) = self.take(open, request).await? {
                return Ok((claim, None));
            }
        }
        Err(IdemError::Contended)
    }

    /// One sending of the first statement of [`Engine::claim_first`], which leaves an unfinished
    /// key found open to the caller (`First::Open`). For the engine's tests.
    #[doc(hidden)]
    pub async fn claim_first_once<P, T>(
        &self,
        request: &Request,
        step: &Step<P>,
        send: &(
             impl AsyncFnOnce(
            &mut PgConnection,
            ClaimArgs<'_>,
        ) -> Result<(Claimed, Option<T>), IdemError>
             + Clone
         ),
    ) -> Result<First<T>, IdemError>
    where
        P: RecoveryPoint,
    {
        let span = tracing::debug_span!("idem.claim", operation = &*request.operation);
        self.send_first_claiming(request, step, send).instrument(span).await
    }

    async fn send_first_claiming<P, T>(
        &self,
        request: &Request,
        step: &Step<P>,
        send: &(
             impl AsyncFnOnce(
            &mut PgConnection,
            ClaimArgs<'_>,
        ) -> Result<(Claimed, Option<T>), IdemError>
             + Clone
         ),
    ) -> Result<First<T>, IdemError>
    where
        P: RecoveryPoint,
    {
        // Counted until the lease is recorded as held (or given back), as a takeover's. A process
        // that is stopping takes no key, but still answers what a read of it decides.
        let Some(_granting) = self.granting() else {
            return match self.read_key(request).await? {
                Read::Decided(claim) => Ok(First::Decided(claim)),
                Read::Open(_) => Ok(First::Decided(Claim::InUse)),
            };
        };
        let mut lease = self.new_lease(request, 0);
        let fence = lease.fence_of(step, true)?.without_id();
        let claim = ClaimArgs {
            account: &request.account_id,
            key: request.key.as_str(),
            credential: request.credential.as_deref(),
            fence: &fence,
        };
        let mut tries = 0;
        let sent = loop {
            match self.send_first(send, claim).await {
                Err(IdemError::Database(err))
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
            Err(err) if err.timed_out() => {
                return match self.read_key(request).await? {
                    Read::Decided(claim) => Ok(First::Decided(claim)),
                    Read::Open(_) => Err(err),
                };
            }
            Err(err) => return Err(self.unheld(request, &lease, err).await),
        };
        let claiming = match claimed.claiming() {
            Ok(claiming) => claiming,
            Err(err) => return Err(self.unheld(request, &lease, err).await),
        };
        let (id, version) = match claiming {
            Claiming::Stored { id, version } => (id, version),
            Claiming::Read(read) => {
                return match self.decide(request, read)? {
                    Read::Decided(claim) => Ok(First::Decided(claim)),
                    // The statement stores a key it finds absent; it reserves no id.
                    Read::Open(Open(Opening::New(_))) => Err(IdemError::Corrupt(
                        "a first statement that found its key absent and stored nothing",
                    )),
                    Read::Open(open) => Ok(First::Open(open)),
                };
            }
        };
        lease.key_id = id;
        if !self.hold_granted(id, lease.token).await {
            return Err(IdemError::LeaseLost);
        }
        let Some(made) = made else {
            return Err(self.unheld(request, &lease, UNMADE).await);
        };
        if let (Some(digest), Some(version)) = (request.credential.as_deref(), version) {
            self.replay_cache.credential_seen(digest, Some((&request.account_id, version)));
        }
        self.observer.event(Event::Claimed);
        lease.moved(step, &lease.phase_span());
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
    async fn unheld(&self, request: &Request, lease: &Lease, err: IdemError) -> IdemError {
        if matches!(&err, IdemError::Database(db) if db.as_database_error().is_some()) {
            return err;
        }
        let holding = Holding::New {
            account: request.account_id.to_string(),
            key: request.key.as_str().to_owned(),
        };
        let reason = "the claim's first phase ended without an answer".to_owned();
        let back = GiveBack { holding, token: lease.token, reason, retry_in: Duration::ZERO };
        if self.give_back(back, true).await == Some(true) {
            tracing::warn!("a key whose first phase ended without an answer was given back");
        }
        err
    }

    /// Sends a first statement once, on a kept claim connection (its statement and lock waits
    /// bounded by `claim_timeout`, as a claim's read) or a pooled one.
    async fn send_first<T>(
        &self,
        send: &(
             impl AsyncFnOnce(
            &mut PgConnection,
            ClaimArgs<'_>,
        ) -> Result<(Claimed, Option<T>), IdemError>
             + Clone
         ),
        claim: ClaimArgs<'_>,
    ) -> Result<(Claimed, Option<T>), IdemError> {
        let Some(kept) = self.claim_connections() else {
            let mut pooled = self.pool.acquire().await?;
            return (send.clone())(&mut pooled, claim).await;
        };
        let mut lent = kept.lend().await?;
        let sent = (send.clone())(lent.connection(), claim).await;
        lent.give_back(match &sent {
            Err(IdemError::Database(err)) => Some(err),
            _ => None,
        });
        sent
    }
}
