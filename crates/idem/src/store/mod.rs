//! The SQL of the key table. Each function is one statement; the engine decides what they mean.
//!
//! - [`claim`]: a request's read of its key, and the takeover of a free or expired lease;
//! - [`lease`]: what the holder of a lease does besides phases (check it before a foreign call,
//!   release it, flag it) and the wake-up a webhook gives a waiting key;
//! - [`sweep`]: the completer's and the reaper's statements, and the operator's list of keys that
//!   wait for a person.
//!
//! The fence every phase commits through, `idem_commit`, is here.

mod claim;
mod lease;
mod sweep;

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use crate::error::IdemError;

pub(crate) use claim::{KeyRow, Lookup, Seen, TakeOver, read, take_over};
pub use lease::wake;
pub(crate) use lease::{before_call, flag, release, unresolved_for};
pub use sweep::{StuckKey, stuck_keys};
pub(crate) use sweep::{flag_stale, reap, take_due};

/// The fence of a phase, `idem_commit` (migrations/20261130008000_idem_commit.sql): inserts a
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
