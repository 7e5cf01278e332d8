//! The SQL of the key table. Each function is one statement; the engine decides what they mean.

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use crate::StoredResponse;
use crate::error::IdemError;

/// A key row as the claim sees it.
#[derive(Debug)]
pub(crate) struct KeyRow {
    pub id: i64,
    pub fingerprint: Vec<u8>,
    pub request_method: String,
    pub request_path: String,
    pub request_id: String,
    pub operation: String,
    pub request_params: Value,
    pub owner_token: Option<Uuid>,
    /// `locked_until > now()`, by the database clock.
    pub lease_active: bool,
    pub needs_human: bool,
    pub response: Option<StoredResponse>,
}

/// What the claim reads by.
#[derive(Debug, Clone)]
pub(crate) struct Lookup {
    pub account_id: String,
    /// The SHA-256 digest of the API key the request presents, when the claim must also check
    /// that it is a live key of `account_id` (see `read`).
    pub credential: Option<Vec<u8>>,
    pub key: String,
}

/// What the claim's read saw.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // matched at once by the caller; a box would only allocate
pub(crate) enum Seen {
    /// The key row.
    Key(KeyRow),
    /// No such key (committed): the id reserved for it, should this request store it.
    Absent(i64),
    /// The credential is not a live API key of the account: nothing was read.
    Unauthenticated,
}

/// Reads the key: one statement, one round trip, that writes nothing. With a credential, the same
/// statement first checks it against `api_keys` (the one table the engine reads that is not its
/// own), so that a request whose account is already known costs no separate authentication round
/// trip, and a revoked key reads nothing. A key that is not there gets an id reserved from the
/// table's sequence (a sequence is not transactional: this neither writes a row nor takes a
/// transaction id), which the first phase stores it under.
pub(crate) async fn read(
    executor: impl PgExecutor<'_>,
    lookup: &Lookup,
) -> Result<Seen, IdemError> {
    let row = sqlx::query!(
        r#"
        WITH principal AS (
            SELECT 1 AS live
             WHERE $3::bytea IS NULL
                OR EXISTS (SELECT 1 FROM api_keys
                            WHERE key_hash = $3 AND account_id = $1 AND revoked_at IS NULL)
        )
        SELECT k.id AS "id?", k.fingerprint AS "fingerprint?",
               k.request_method AS "request_method?", k.request_path AS "request_path?",
               k.request_id AS "request_id?", k.operation AS "operation?",
               k.request_params AS "request_params?", k.owner_token AS "owner_token?",
               coalesce(k.locked_until > now(), false) AS "lease_active!",
               k.needs_human_at IS NOT NULL AS "needs_human!",
               k.response_status AS "response_status?", k.response_headers AS "response_headers?",
               k.response_body AS "response_body?",
               CASE WHEN k.id IS NULL THEN nextval('idempotency_keys_id_seq') END AS "reserved?"
          FROM principal
          LEFT JOIN idempotency_keys k ON k.account_id = $1 AND k.idempotency_key = $2
        "#,
        lookup.account_id,
        lookup.key,
        lookup.credential.as_deref(),
    )
    .fetch_optional(executor)
    .await?;
    // No row: the principal was empty.
    let Some(row) = row else { return Ok(Seen::Unauthenticated) };
    let Some(id) = row.id else {
        return Ok(Seen::Absent(present(row.reserved)?));
    };
    // The key's own columns are NOT NULL: with an id, all of them are present.
    let response = stored_response(row.response_status, row.response_headers, row.response_body)?;
    Ok(Seen::Key(KeyRow {
        id,
        fingerprint: present(row.fingerprint)?,
        request_method: present(row.request_method)?,
        request_path: present(row.request_path)?,
        request_id: present(row.request_id)?,
        operation: present(row.operation)?,
        request_params: present(row.request_params)?,
        owner_token: row.owner_token,
        lease_active: row.lease_active,
        needs_human: row.needs_human,
        response,
    }))
}

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

/// What a takeover did.
#[derive(Debug)]
pub(crate) enum TakeOver {
    /// The lease is ours: the key's recovery point and attempts.
    Taken(String, i32),
    /// The key is older than the processor's window: flagged for a person instead, untouched
    /// otherwise.
    Flagged,
    /// Someone else took or finished the key since it was read.
    Missed,
}

/// Takes the lease of an unfinished key whose lease is free or expired, if nobody changed the
/// owner since `observed` was read (compare and swap), and records the attempt for `request_id`.
/// A key created more than `window_ms` ago is flagged for a person instead: no one may drive it
/// again (the processor has forgotten its downstream keys).
pub(crate) async fn take_over(
    executor: impl PgExecutor<'_>,
    key_id: i64,
    observed: Option<Uuid>,
    token: Uuid,
    lease_ms: i64,
    request_id: &str,
    window_ms: Option<i64>,
) -> Result<TakeOver, IdemError> {
    let row = sqlx::query!(
        r#"
        WITH free AS (
            SELECT id, $6::float8 IS NOT NULL
                       AND created_at < now() - $6 * interval '1 millisecond' AS too_old
              FROM idempotency_keys
             WHERE id = $1
               AND owner_token IS NOT DISTINCT FROM $2
               AND completed_at IS NULL AND needs_human_at IS NULL
               AND (locked_until IS NULL OR locked_until <= now())
               FOR UPDATE
        ), taken AS (
            UPDATE idempotency_keys k
               SET owner_token = $3, locked_until = now() + $4 * interval '1 millisecond',
                   attempts = k.attempts + 1, last_run_at = now()
              FROM free
             WHERE k.id = free.id AND NOT free.too_old
            RETURNING k.id, k.recovery_point, k.attempts
        ), flagged AS (
            UPDATE idempotency_keys k
               SET needs_human_at = now(), owner_token = NULL, locked_until = NULL,
                   last_error = 'older than the processor''s idempotency window'
                                || coalesce(' (last error: ' || k.last_error || ')', '')
              FROM free
             WHERE k.id = free.id AND free.too_old
            RETURNING k.id
        ), logged AS (
            INSERT INTO idempotency_attempts (key_id, attempt, request_id, took_over, recovery_point)
            SELECT id, attempts, $5, $2::uuid IS NOT NULL, recovery_point FROM taken
        )
        SELECT free.too_old AS "too_old!", taken.recovery_point AS "recovery_point?",
               taken.attempts AS "attempts?"
          FROM free LEFT JOIN taken ON true
        "#,
        key_id,
        observed,
        token,
        lease_ms as f64,
        request_id,
        window_ms.map(|ms| ms as f64),
    )
    .fetch_optional(executor)
    .await?;
    Ok(match row {
        None => TakeOver::Missed,
        Some(row) if row.too_old => TakeOver::Flagged,
        Some(row) => match (row.recovery_point, row.attempts) {
            (Some(point), Some(attempts)) => TakeOver::Taken(point, attempts),
            _ => return Err(IdemError::Corrupt("a free key that could not be taken")),
        },
    })
}

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
/// the completer's next attempt. Does nothing if `token` no longer owns the key.
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
               next_attempt_at = now() + $4 * interval '1 millisecond'
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

/// Makes an unfinished key due for the completer now, because news arrived that lets it finish
/// (a webhook from the processor): `next_attempt_at` moves to now. Nothing else changes: a lease
/// held now is left alone (its holder finishes or releases, and the release sets the next attempt
/// itself); a finished key or one waiting for a person is not touched. True if the key was
/// unfinished and moved.
pub async fn wake(executor: impl PgExecutor<'_>, key_id: i64) -> Result<bool, sqlx::Error> {
    let woken = sqlx::query!(
        r#"
        UPDATE idempotency_keys SET next_attempt_at = now()
         WHERE id = $1 AND completed_at IS NULL AND needs_human_at IS NULL
           AND next_attempt_at > now()
        "#,
        key_id,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(woken == 1)
}

fn present<T>(column: Option<T>) -> Result<T, IdemError> {
    column.ok_or(IdemError::Corrupt("a claimed key row with a NULL column"))
}

fn stored_response(
    status: Option<i16>,
    headers: Option<Value>,
    body: Option<Vec<u8>>,
) -> Result<Option<StoredResponse>, IdemError> {
    match (status, headers, body) {
        (None, _, _) => Ok(None),
        (Some(status), headers, Some(body)) => {
            let headers = match headers {
                Some(headers) => serde_json::from_value(headers)
                    .map_err(|_| IdemError::Corrupt("response headers are not name/value pairs"))?,
                None => Vec::new(),
            };
            let status =
                u16::try_from(status).map_err(|_| IdemError::Corrupt("negative status"))?;
            Ok(Some(StoredResponse { status, headers, body }))
        }
        (Some(_), _, None) => Err(IdemError::Corrupt("a stored status without a body")),
    }
}

/// A key the completer took.
#[derive(Debug)]
pub(crate) struct DueRow {
    pub id: i64,
    pub token: Uuid,
    pub recovery_point: String,
    pub attempts: i32,
    pub operation: String,
    pub request_params: Value,
    pub request_id: String,
    /// Older than the processor's idempotency window.
    pub too_old: bool,
}

/// Takes up to `limit` unfinished keys whose lease is free or expired and whose next attempt is
/// due, each with a fresh owner token. `SKIP LOCKED`: several completers never take one key.
pub(crate) async fn take_due(
    executor: impl PgExecutor<'_>,
    limit: i64,
    lease_ms: i64,
    window_ms: i64,
) -> Result<Vec<DueRow>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        WITH due AS (
            SELECT id, owner_token IS NOT NULL AS took_over FROM idempotency_keys
             WHERE completed_at IS NULL AND needs_human_at IS NULL AND next_attempt_at <= now()
               AND (locked_until IS NULL OR locked_until <= now())
             ORDER BY next_attempt_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED
        ), taken AS (
            UPDATE idempotency_keys k
               SET owner_token = gen_random_uuid(),
                   locked_until = now() + $2 * interval '1 millisecond',
                   attempts = k.attempts + 1, last_run_at = now()
              FROM due
             WHERE k.id = due.id
            RETURNING k.id, k.owner_token, k.recovery_point, k.attempts, k.operation,
                      k.request_params, k.request_id, k.created_at, due.took_over
        ), logged AS (
            -- The completer's attempts have no request id.
            INSERT INTO idempotency_attempts (key_id, attempt, request_id, took_over, recovery_point)
            SELECT id, attempts, NULL, took_over, recovery_point FROM taken
        )
        SELECT id AS "id!", owner_token AS "owner_token!", recovery_point AS "recovery_point!",
               attempts AS "attempts!", operation AS "operation!",
               request_params AS "request_params!", request_id AS "request_id!",
               created_at < now() - $3 * interval '1 millisecond' AS "too_old!"
          FROM taken
        "#,
        limit,
        lease_ms as f64,
        window_ms as f64,
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
            operation: r.operation,
            request_params: r.request_params,
            request_id: r.request_id,
            too_old: r.too_old,
        })
        .collect())
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
