//! The completer's and the reaper's statements, and the keys that wait for a person.

use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

/// A key the completer took.
#[derive(Debug)]
pub(crate) struct DueRow {
    pub id: i64,
    pub token: Uuid,
    pub recovery_point: String,
    /// Every attempt so far, this one included (the claim, client retries, completer runs).
    pub attempts: i32,
    /// The completer's own runs so far, this one included: what `worker.max_attempts` bounds.
    pub completer_attempts: i32,
    pub operation: String,
    pub request_params: Value,
    pub request_id: String,
    /// Older than the processor's idempotency window.
    pub too_old: bool,
}

/// Takes up to `limit` unfinished keys whose lease is free or expired and whose next attempt is
/// due, each with a fresh owner token. `SKIP LOCKED`: several completers never take one key.
/// Counts the run in `attempts` (every attempt) and in `completer_attempts` (the completer's own,
/// which its give-up bound counts; a client's takeover never moves it). Only keys of the named
/// `operations` are taken.
pub(crate) async fn take_due(
    executor: impl PgExecutor<'_>,
    limit: i64,
    lease_ms: i64,
    window_ms: i64,
    operations: &[&str],
) -> Result<Vec<DueRow>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        WITH due AS (
            SELECT id, owner_token IS NOT NULL AS took_over FROM idempotency_keys
             WHERE completed_at IS NULL AND needs_human_at IS NULL AND next_attempt_at <= now()
               AND (locked_until IS NULL OR locked_until <= now())
               AND operation = ANY($4::text[])
             ORDER BY next_attempt_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED
        ), taken AS (
            UPDATE idempotency_keys k
               SET owner_token = gen_random_uuid(),
                   locked_until = now() + $2 * interval '1 millisecond',
                   attempts = k.attempts + 1, completer_attempts = k.completer_attempts + 1,
                   last_run_at = now()
              FROM due
             WHERE k.id = due.id
            RETURNING k.id, k.owner_token, k.recovery_point, k.attempts, k.completer_attempts,
                      k.operation, k.request_params, k.request_id, k.created_at, due.took_over
        ), logged AS (
            -- The completer's attempts have no request id.
            INSERT INTO idempotency_attempts (key_id, attempt, request_id, took_over, recovery_point)
            SELECT id, attempts, NULL, took_over, recovery_point FROM taken
        )
        SELECT id AS "id!", owner_token AS "owner_token!", recovery_point AS "recovery_point!",
               attempts AS "attempts!", completer_attempts AS "completer_attempts!",
               operation AS "operation!",
               request_params AS "request_params!", request_id AS "request_id!",
               created_at < now() - $3 * interval '1 millisecond' AS "too_old!"
          FROM taken
        "#,
        limit,
        lease_ms as f64,
        window_ms as f64,
        operations as &[&str],
    )
    .fetch_all(executor)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| DueRow {
            id: r.id,
            token: r.owner_token,
            recovery_point: r.recovery_point,
            attempts: r.attempts,
            completer_attempts: r.completer_attempts,
            operation: r.operation,
            request_params: r.request_params,
            request_id: r.request_id,
            too_old: r.too_old,
        })
        .collect())
}

/// Deletes up to `limit` keys completed before the retention window: retention counts from
/// completion, so a key the completer finished late still replays for the whole window.
pub(crate) async fn reap(
    executor: impl PgExecutor<'_>,
    limit: i64,
    retention_ms: i64,
) -> Result<u64, sqlx::Error> {
    let deleted = sqlx::query!(
        r#"
        DELETE FROM idempotency_keys
         WHERE id IN (
            SELECT id FROM idempotency_keys
             WHERE completed_at < now() - $2 * interval '1 millisecond'
             ORDER BY completed_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED)
        "#,
        limit,
        retention_ms as f64,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(deleted)
}

/// Flags unfinished, unleased keys older than the retention window: they are never deleted.
pub(crate) async fn flag_stale(
    executor: impl PgExecutor<'_>,
    retention_ms: i64,
) -> Result<u64, sqlx::Error> {
    let flagged = sqlx::query!(
        r#"
        UPDATE idempotency_keys
           SET needs_human_at = now(),
               last_error = 'unfinished past the retention window'
                            || coalesce(' (last error: ' || last_error || ')', '')
         WHERE completed_at IS NULL AND needs_human_at IS NULL
           AND created_at < now() - $1 * interval '1 millisecond'
           AND (locked_until IS NULL OR locked_until <= now())
        "#,
        retention_ms as f64,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(flagged)
}

/// A key that waits for a person, as the operator sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StuckKey {
    /// The row id.
    pub id: i64,
    /// The scope.
    pub account_id: String,
    /// The client's key.
    pub idempotency_key: String,
    /// The operation.
    pub operation: String,
    /// Where it stopped.
    pub recovery_point: String,
    /// Attempts so far.
    pub attempts: i32,
    /// Why it stopped, and the last error.
    pub last_error: Option<String>,
    /// Age in seconds.
    pub age_seconds: i64,
}

/// Keys flagged for a person, oldest first.
pub async fn stuck_keys(
    executor: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<StuckKey>, sqlx::Error> {
    sqlx::query_as!(
        StuckKey,
        r#"
        SELECT id, account_id, idempotency_key, operation, recovery_point, attempts, last_error,
               extract(epoch FROM now() - created_at)::bigint AS "age_seconds!"
          FROM idempotency_keys
         WHERE needs_human_at IS NOT NULL AND completed_at IS NULL
         ORDER BY created_at
         LIMIT $1
        "#,
        limit
    )
    .fetch_all(executor)
    .await
}
