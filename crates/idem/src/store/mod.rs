//! The SQL of the key table. Each function is one statement; the engine decides what they mean.
//!
//! - [`claim`]: a request's read of its key, and the takeover of a free or expired lease;
//! - [`lease`]: what the holder of a lease does besides phases (check it before a foreign call,
//!   release it, flag it) and the wake-up a webhook gives a waiting key;
//! - [`sweep`]: the completer's and the reaper's statements, and the operator's list of keys that
//!   wait for a person.
//!
//! The fences are here: `idem_commit_fence` (a new key, and one-statement phases, with the
//! engine's [`FenceRecord`]) and the typed moves of a stored key, `idem_advance` and
//! `idem_finish`.

mod claim;
mod lease;
mod sweep;

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::StoredResponse;
use crate::error::IdemError;

pub use claim::Claimed;
pub(crate) use claim::{Claiming, KeyRow, Read, Seen, TakeOver, fresh, read, take_over};
pub use lease::wake;
pub(crate) use lease::{before_call, flag, release, release_unheld, unresolved_for};
pub use sweep::{StuckKey, stuck_keys};
pub(crate) use sweep::{flag_stale, reap, take_due};

/// The fence of a new key and of a one-statement phase, as the database's `idem_fence` record
/// (docs/schema.sql): built by the engine, passed through
/// unopened by an operation's statement to `idem_commit_fence($n)`, which inserts a new key or
/// moves a stored one, fenced on the lease. Its fields travel as binary values: no JSON is built
/// here or parsed there. sqlx encodes the fields in the order they are declared: it must be the
/// order of the type's attributes in the migration.
#[derive(Debug, Clone, sqlx::Type)]
#[sqlx(type_name = "idem_fence")]
pub struct FenceRecord {
    /// `None` only for a new key whose first phase claims it: `idem_claim` stores it under an id
    /// from the sequence.
    key_id: Option<i64>,
    token: Uuid,
    expected: String,
    lease_ms: f64,
    next_point: String,
    plan: Option<Value>,
    status: Option<i16>,
    headers: Option<Value>,
    body: Option<Vec<u8>>,
    account_id: Option<String>,
    idempotency_key: Option<String>,
    fingerprint: Option<Vec<u8>>,
    method: Option<String>,
    path: Option<String>,
    request_id: Option<String>,
    operation: Option<String>,
    params: Option<Value>,
}

/// A new key's own columns, for [`FenceRecord::new`].
pub(crate) struct NewKeyRecord<'a> {
    pub account_id: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a [u8],
    pub method: &'a str,
    pub path: &'a str,
    pub request_id: &'a str,
    pub operation: &'a str,
    pub params: &'a Value,
}

impl FenceRecord {
    /// The fence that moves the key `fence` holds to `next`, with the call planned there, or
    /// stores `response` as its final answer; with `new`, the key is inserted rather than moved.
    pub(crate) fn new(
        fence: &Fence<'_>,
        next: &str,
        plan: Option<&Value>,
        response: Option<&StoredResponse>,
        new: Option<NewKeyRecord<'_>>,
    ) -> Result<Self, sqlx::Error> {
        let (status, headers, body) = match response {
            Some(response) => (
                Some(i16::try_from(response.status).map_err(encode_error)?),
                Some(serde_json::to_value(&response.headers).map_err(encode_error)?),
                Some(response.body.clone()),
            ),
            None => (None, None, None),
        };
        Ok(Self {
            key_id: Some(fence.key_id),
            token: fence.token,
            expected: fence.expected.to_owned(),
            lease_ms: fence.lease_ms as f64,
            next_point: next.to_owned(),
            // A JSON null is no plan.
            plan: plan.filter(|plan| !plan.is_null()).cloned(),
            status,
            headers,
            body,
            account_id: new.as_ref().map(|new| new.account_id.to_owned()),
            idempotency_key: new.as_ref().map(|new| new.key.to_owned()),
            fingerprint: new.as_ref().map(|new| new.fingerprint.to_vec()),
            method: new.as_ref().map(|new| new.method.to_owned()),
            path: new.as_ref().map(|new| new.path.to_owned()),
            request_id: new.as_ref().map(|new| new.request_id.to_owned()),
            operation: new.as_ref().map(|new| new.operation.to_owned()),
            params: new.map(|new| new.params.clone()),
        })
    }
}

impl FenceRecord {
    /// The same fence for a new key that has no id yet: `idem_claim` takes one from the sequence
    /// when it stores the key.
    pub(crate) fn without_id(mut self) -> Self {
        self.key_id = None;
        self
    }
}

fn encode_error(err: impl std::error::Error + Send + Sync + 'static) -> sqlx::Error {
    sqlx::Error::Encode(Box::new(err))
}

/// Commits `fence` in a statement of its own (`idem_commit_fence`): stores a new key, or moves a
/// stored one. Returns the key's id; fails with SQLSTATE `IL001` when the lease is lost, and with
/// a unique violation on `idempotency_keys_account_key` when a new key was stored by another
/// request first.
pub(crate) async fn commit(
    executor: impl PgExecutor<'_>,
    fence: &FenceRecord,
) -> Result<i64, sqlx::Error> {
    let row = sqlx::query!(r#"SELECT idem_commit_fence($1) AS "key_id!""#, fence as &FenceRecord)
        .fetch_one(executor)
        .await?;
    Ok(row.key_id)
}

/// Moves a stored key to `next` with the call planned there, renewing the lease, fenced on
/// `token` at `expected` (`idem_advance`, docs/schema.sql). `None` when the lease is lost.
pub(crate) async fn advance(
    executor: impl PgExecutor<'_>,
    fence: &Fence<'_>,
    next: &str,
    plan: Option<&Value>,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT idem_advance($1, $2, $3, $4, $5, $6) AS "key_id""#,
        fence.key_id,
        fence.token,
        fence.expected,
        next,
        plan,
        fence.lease_ms as f64,
    )
    .fetch_one(executor)
    .await
}

/// Stores a stored key's final answer and drops the lease, fenced on `token` at `expected`
/// (`idem_finish`). `None` when the lease is lost.
pub(crate) async fn finish(
    executor: impl PgExecutor<'_>,
    fence: &Fence<'_>,
    response: &StoredResponse,
) -> Result<Option<i64>, sqlx::Error> {
    let status = i16::try_from(response.status).map_err(encode_error)?;
    let headers = serde_json::to_value(&response.headers).map_err(encode_error)?;
    sqlx::query_scalar!(
        r#"SELECT idem_finish($1, $2, $3, $4, $5, $6) AS "key_id""#,
        fence.key_id,
        fence.token,
        fence.expected,
        status,
        headers,
        &response.body,
    )
    .fetch_one(executor)
    .await
}

/// What fences a stored key's move: the key, this lease's token, the recovery point the phase
/// started from, and how long a renewed lease lasts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fence<'a> {
    pub key_id: i64,
    pub token: Uuid,
    pub expected: &'a str,
    pub lease_ms: i64,
}

/// What begins a phase of a stored key: `BEGIN`, and the key's row locked if this lease still
/// holds it (`FOR NO KEY UPDATE`), sent as one simple query, so it costs no round trip of its own.
/// From the phase's first statement to its end, a takeover waits for it (up to its claim
/// timeout, then `503`; after the phase, it finds the key moved on), however long the phase waits
/// for its other locks after its lease ran out; rows that only refer to the key (`FOR KEY
/// SHARE`) do not wait. `SKIP LOCKED`: it never waits, so it cannot fail on a timeout (which would
/// leave the pooled connection in an aborted transaction, the `BEGIN` not being counted yet); a
/// row locked at that moment is being taken over already (or woken), and the fenced commit
/// decides, as for a lease already lost. Both values are typed (an integer and a UUID): nothing a
/// client sends reaches the text.
pub(crate) fn begin_holding(key_id: i64, token: Uuid) -> String {
    format!(
        "BEGIN; SELECT FROM idempotency_keys WHERE id = {key_id} AND owner_token = '{token}' \
         FOR NO KEY UPDATE SKIP LOCKED"
    )
}

/// Bounds, for the rest of the transaction, how long a statement runs and waits for a row lock
/// (`SET LOCAL statement_timeout, lock_timeout`).
pub(crate) async fn bound_waits(conn: &mut PgConnection, timeout_ms: i64) -> Result<(), IdemError> {
    let bound = format!("{timeout_ms}ms");
    sqlx::query!(
        r#"SELECT set_config('lock_timeout', $1, true) AS "lock!",
                  set_config('statement_timeout', $1, true) AS "statement!""#,
        bound,
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}
