//! Read-only views of the key table and its attempts, for an operator's page (the API's
//! inspector): the only place outside the engine that reads them, so their SQL stays here.
//! Times come formatted in UTC by the database, which is the clock every lease is judged by.

use sqlx::PgExecutor;
use uuid::Uuid;

/// One key as an overview lists it.
#[derive(Debug, Clone)]
pub struct KeySummary {
    /// The row id.
    pub id: i64,
    /// The scope.
    pub account_id: String,
    /// The client's key.
    pub key: String,
    /// The operation's stored name.
    pub operation: String,
    /// The request's method.
    pub method: String,
    /// The request's path.
    pub path: String,
    /// Where it stands.
    pub recovery_point: String,
    /// The holder's token, if a process leased it.
    pub owner_token: Option<Uuid>,
    /// Attempts so far.
    pub attempts: i32,
    /// When the lease ends or ended, `HH24:MI:SS` UTC.
    pub lease_until: Option<String>,
    /// Whether the lease is still running by the database's clock.
    pub lease_active: bool,
    /// The stored answer's status.
    pub response_status: Option<i16>,
    /// An answer is stored.
    pub finished: bool,
    /// Flagged for a person.
    pub flagged: bool,
    /// Why it stopped, or the last transient error.
    pub last_error: Option<String>,
    /// Seconds since the claim.
    pub age_s: f64,
}

impl KeySummary {
    /// Neither answered nor waiting for a person.
    pub fn in_flight(&self) -> bool {
        !self.finished && !self.flagged
    }
}

/// The two lists of an overview.
#[derive(Debug, Clone, Default)]
pub struct KeyLists {
    /// The newest keys of each account asked for, in the order asked, newest first within one.
    pub recent: Vec<KeySummary>,
    /// Keys flagged for a person, most recently flagged first. A key can be in both lists.
    pub flagged: Vec<KeySummary>,
}

/// The newest `per_account` keys of each of `accounts`, and the `flagged` most recently flagged
/// keys, in one statement.
pub async fn key_lists(
    executor: impl PgExecutor<'_>,
    accounts: &[String],
    per_account: i64,
    flagged: i64,
) -> Result<KeyLists, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        WITH recent AS (
            SELECT k.id, row_number() OVER (ORDER BY a.n, k.id DESC) AS n
              FROM unnest($1::text[]) WITH ORDINALITY AS a(id, n)
              CROSS JOIN LATERAL (
                    SELECT id FROM idempotency_keys k
                     WHERE k.account_id = a.id ORDER BY k.id DESC LIMIT $2) k
        ), flagged AS (
            SELECT id, row_number() OVER (ORDER BY needs_human_at DESC) AS n
              FROM idempotency_keys WHERE needs_human_at IS NOT NULL
             ORDER BY needs_human_at DESC LIMIT $3
        ), listed AS (
            SELECT false AS waiting_list, id, n FROM recent
            UNION ALL
            SELECT true, id, n FROM flagged
        )
        SELECT l.waiting_list AS "waiting_list!", k.account_id AS "account_id!", k.id AS "id!",
               k.idempotency_key AS "key!", k.operation AS "operation!",
               k.request_method AS "method!", k.request_path AS "path!",
               k.recovery_point AS "recovery_point!", k.owner_token AS "owner_token?",
               k.attempts AS "attempts!",
               to_char(k.locked_until AT TIME ZONE 'UTC', 'HH24:MI:SS') AS "lease_until?",
               coalesce(k.locked_until > now(), false) AS "lease_active!",
               k.response_status AS "response_status?", k.completed_at IS NOT NULL AS "finished!",
               k.needs_human_at IS NOT NULL AS "flagged!", k.last_error AS "last_error?",
               extract(epoch FROM now() - k.created_at)::float8 AS "age_s!"
          FROM listed l
          JOIN idempotency_keys k ON k.id = l.id
         ORDER BY l.waiting_list, l.n
        "#,
        accounts,
        per_account,
        flagged,
    )
    .fetch_all(executor)
    .await?;
    let mut lists = KeyLists::default();
    for row in rows {
        let summary = KeySummary {
            id: row.id,
            account_id: row.account_id,
            key: row.key,
            operation: row.operation,
            method: row.method,
            path: row.path,
            recovery_point: row.recovery_point,
            owner_token: row.owner_token,
            attempts: row.attempts,
            lease_until: row.lease_until,
            lease_active: row.lease_active,
            response_status: row.response_status,
            finished: row.finished,
            flagged: row.flagged,
            last_error: row.last_error,
            age_s: row.age_s,
        };
        if row.waiting_list { lists.flagged.push(summary) } else { lists.recent.push(summary) }
    }
    Ok(lists)
}

/// One key with everything an operator may ask about it.
#[derive(Debug, Clone)]
pub struct KeyDetail {
    /// The row id.
    pub id: i64,
    /// The scope.
    pub account_id: String,
    /// The client's key.
    pub idempotency_key: String,
    /// The operation's stored name.
    pub operation: String,
    /// The request's method.
    pub request_method: String,
    /// The request's path.
    pub request_path: String,
    /// The request that claimed it.
    pub request_id: String,
    /// Where it stands.
    pub recovery_point: String,
    /// The holder's token, if a process leased it.
    pub owner_token: Option<Uuid>,
    /// Whether the lease is still running by the database's clock.
    pub lease_active: bool,
    /// When the lease ends or ended, `HH24:MI:SS.MS` UTC.
    pub lease_until: Option<String>,
    /// Attempts so far.
    pub attempts: i32,
    /// The stored answer's status.
    pub response_status: Option<i16>,
    /// The stored answer's body.
    pub response_body: Option<Vec<u8>>,
    /// Why it stopped, or the last transient error.
    pub last_error: Option<String>,
    /// An answer is stored.
    pub finished: bool,
    /// Flagged for a person.
    pub flagged: bool,
    /// When it was claimed (UTC).
    pub created: String,
    /// When its answer was stored (UTC).
    pub completed: Option<String>,
    /// When it was flagged for a person (UTC).
    pub flagged_at: Option<String>,
    /// When the completer may try it next (UTC).
    pub next_attempt: Option<String>,
}

/// The key with row id `id`, if there is one.
pub async fn key_detail(
    executor: impl PgExecutor<'_>,
    id: i64,
) -> Result<Option<KeyDetail>, sqlx::Error> {
    sqlx::query_as!(
        KeyDetail,
        r#"
        SELECT id, account_id, idempotency_key, operation, request_method, request_path,
               request_id, recovery_point, owner_token,
               coalesce(locked_until > now(), false) AS "lease_active!",
               to_char(locked_until AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') AS lease_until,
               attempts, response_status, response_body, last_error,
               completed_at IS NOT NULL AS "finished!", needs_human_at IS NOT NULL AS "flagged!",
               to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS "created!",
               to_char(completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS completed,
               to_char(needs_human_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS flagged_at,
               to_char(next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS next_attempt
          FROM idempotency_keys
         WHERE id = $1
        "#,
        id
    )
    .fetch_optional(executor)
    .await
}

/// An attempt after the claim: a retry that resumed or took over, or the completer.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// Its number (the claim is 1).
    pub attempt: i32,
    /// The request that made it; `None` for the completer.
    pub request_id: Option<String>,
    /// It took the key over from a holder whose lease had expired.
    pub took_over: bool,
    /// The recovery point it started from.
    pub recovery_point: String,
    /// When it started (UTC).
    pub at: String,
}

/// Every attempt on key `key_id` after its claim, in order.
pub async fn attempts(
    executor: impl PgExecutor<'_>,
    key_id: i64,
) -> Result<Vec<AttemptRecord>, sqlx::Error> {
    sqlx::query_as!(
        AttemptRecord,
        r#"
        SELECT attempt, request_id, took_over, recovery_point,
               to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS "at!"
          FROM idempotency_attempts WHERE key_id = $1 ORDER BY attempt
        "#,
        key_id
    )
    .fetch_all(executor)
    .await
}
