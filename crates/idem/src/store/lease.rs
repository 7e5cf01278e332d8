//! What the holder of a lease does besides phases, and the wake-up a webhook gives a waiting key.

use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

/// Right before a foreign call: checks, fenced, that `token` still holds the key at `expected`
/// and extends the lease. `None` when the lease is lost; otherwise the call planned at the
/// recovery point, if any.
pub(crate) async fn before_call(
    executor: impl PgExecutor<'_>,
    key_id: i64,
    token: Uuid,
    expected: &str,
    lease_ms: i64,
) -> Result<Option<Option<Value>>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        UPDATE idempotency_keys
           SET locked_until = now() + $4 * interval '1 millisecond'
         WHERE id = $1 AND owner_token = $2 AND recovery_point = $3
        RETURNING planned_call
        "#,
        key_id,
        token,
        expected,
        lease_ms as f64,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|r| r.planned_call))
}

/// Marks the planned call's outcome as unresolved, unless it already was, and answers for how
/// long it has been, by the database clock; fenced. `None` when the lease is lost.
pub(crate) async fn unresolved_for(
    executor: impl PgExecutor<'_>,
    key_id: i64,
    token: Uuid,
) -> Result<Option<f64>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        UPDATE idempotency_keys
           SET unresolved_at = coalesce(unresolved_at, now())
         WHERE id = $1 AND owner_token = $2
        RETURNING extract(epoch FROM now() - unresolved_at)::float8 AS "seconds!"
        "#,
        key_id,
        token,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|r| r.seconds))
}

/// Gives the lease back after a transient failure, keeping the recovery point, and schedules
/// the completer's next attempt: after `retry_in_ms`, or now if the key was woken since its lease
/// or last phase began (news that lets it finish arrived while it was held). Does nothing if
/// `token` no longer owns the key.
pub(crate) async fn release(
    executor: impl PgExecutor<'_>,
    key_id: i64,
    token: Uuid,
    error: &str,
    retry_in_ms: i64,
) -> Result<bool, sqlx::Error> {
    let released = sqlx::query!(
        r#"
        UPDATE idempotency_keys
           SET owner_token = NULL, locked_until = NULL, last_error = $3,
               next_attempt_at = CASE WHEN woken_at > last_run_at THEN now()
                                      ELSE now() + $4 * interval '1 millisecond' END
         WHERE id = $1 AND owner_token = $2
        "#,
        key_id,
        token,
        error,
        retry_in_ms as f64,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(released == 1)
}

/// As [`release`], for a new key a claim's first phase may have stored under `token` when the
/// engine could not learn whether its statement committed (the connection failed as it ran), so it
/// knows no id: found by its account and key, and released only if `token` owns it (nothing is
/// done when the statement did not commit).
pub(crate) async fn release_unheld(
    executor: impl PgExecutor<'_>,
    account_id: &str,
    key: &str,
    token: Uuid,
    error: &str,
) -> Result<bool, sqlx::Error> {
    let released = sqlx::query!(
        r#"
        UPDATE idempotency_keys
           SET owner_token = NULL, locked_until = NULL, last_error = $4, next_attempt_at = now()
         WHERE account_id = $1 AND idempotency_key = $2 AND owner_token = $3
        "#,
        account_id,
        key,
        token,
        error,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(released == 1)
}

/// Makes an unfinished key due for the completer now, because news arrived that lets it finish
/// (a webhook from the processor): `next_attempt_at` moves to now, and `woken_at` records the
/// news. A lease held now is left alone: its holder finishes, or releases, and a release after a
/// wake schedules the next attempt now instead of after its back-off. A finished key or one
/// waiting for a person is not touched. True if the key was woken.
///
/// A key whose row is locked right now is skipped, not waited for: its holder is in a phase
/// (`store::begin_holding`), or a claim or the completer is taking it, so someone is at work on
/// it. Waiting would deadlock with a phase, which holds its key and then the payment, while the
/// caller holds the payment. The news is recorded all the same, and the holder's next attempt
/// finds it; only the shortcut past a back-off is lost, in that race.
///
/// `woken_at` is read from the clock when the row is written, which no phase holds then, so it is
/// later than the last phase's `last_run_at`.
pub async fn wake(executor: impl PgExecutor<'_>, key_id: i64) -> Result<bool, sqlx::Error> {
    let woken = sqlx::query!(
        r#"
        UPDATE idempotency_keys
           SET next_attempt_at = least(next_attempt_at, now()), woken_at = clock_timestamp()
         WHERE id = (SELECT id FROM idempotency_keys
                      WHERE id = $1 AND completed_at IS NULL AND needs_human_at IS NULL
                        FOR NO KEY UPDATE SKIP LOCKED)
        "#,
        key_id,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(woken == 1)
}

/// Flags a key for a person and releases it, if `token` still owns it.
pub(crate) async fn flag(
    executor: impl PgExecutor<'_>,
    key_id: i64,
    token: Uuid,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let flagged = sqlx::query!(
        r#"
        UPDATE idempotency_keys
           SET needs_human_at = now(), owner_token = NULL, locked_until = NULL,
               last_error = $3 || coalesce(' (last error: ' || last_error || ')', '')
         WHERE id = $1 AND owner_token = $2
        "#,
        key_id,
        token,
        reason,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(flagged == 1)
}
