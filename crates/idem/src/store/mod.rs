//! The SQL of the key table. Each function is one statement; the engine decides what they mean.
//!
//! - [`claim`]: a request's read of its key, and the takeover of a free or expired lease;
//! - [`lease`]: what the holder of a lease does besides phases (check it before a foreign call,
//!   release it, flag it) and the wake-up a webhook gives a waiting key;
//! - [`sweep`]: the completer's and the reaper's statements, and the operator's list of keys that
//!   wait for a person.
//!
//! The fences are here: `idem_commit` (a new key, and one-statement phases) and the typed moves
//! of a stored key, `idem_advance` and `idem_finish`.

mod claim;
mod lease;
mod sweep;

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::StoredResponse;
use crate::error::IdemError;

pub(crate) use claim::{KeyRow, Lookup, Seen, TakeOver, read, take_over};
pub use lease::wake;
pub(crate) use lease::{before_call, flag, release, unresolved_for};
pub use sweep::{StuckKey, stuck_keys};
pub(crate) use sweep::{flag_stale, reap, take_due};

/// The fence of a new key and of a one-statement phase, `idem_commit`
/// (migrations/20261130008000_idem_commit.sql, 20261201000000_idem_fence_typed.sql): inserts a
/// new key or moves a stored one, fenced on the lease. Returns the key's id; fails with SQLSTATE
/// `IL001` when the lease is lost, and with a unique violation on `idempotency_keys_account_key`
/// when a new key was stored by another request first.
pub(crate) async fn commit(
    executor: impl PgExecutor<'_>,
    fence: &Value,
) -> Result<i64, sqlx::Error> {
    let row =
        sqlx::query!(r#"SELECT idem_commit($1) AS "key_id!""#, fence).fetch_one(executor).await?;
    Ok(row.key_id)
}

/// Moves a stored key to `next` with the call planned there, renewing the lease, fenced on
/// `token` at `expected` (`idem_advance`, migrations/20261201000000_idem_fence_typed.sql, as
/// redefined by 20261201000100_idem_advance_null_plan.sql). `None` when the lease is lost.
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
    let status =
        i16::try_from(response.status).map_err(|err| sqlx::Error::Encode(Box::new(err)))?;
    let headers = serde_json::to_value(&response.headers)
        .map_err(|err| sqlx::Error::Encode(Box::new(err)))?;
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
