//! The audit trail: who did what to which object, from which request and key, when.

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::retention::{Batch, sql_days};

/// One audit record, written in the same transaction as the change it describes.
#[derive(Debug)]
pub struct AuditEvent<'a> {
    /// The account.
    pub account_id: &'a str,
    /// `pay_…`, `re_…`
    pub object_id: &'a str,
    /// E.g. `payment.created`, `payment.charged`.
    pub action: &'a str,
    /// The first request of the key.
    pub request_id: &'a str,
    /// The key.
    pub idempotency_key_id: i64,
    /// Anything else worth knowing (the processor's ids, the downstream key).
    pub detail: Value,
}

/// What an audit record is about: an account's object, and what happened to it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The account.
    pub account_id: &'a str,
    /// `pay_…`, `re_…`
    pub object_id: &'a str,
    /// E.g. `payment.reconciled`.
    pub action: &'a str,
}

/// Records an event.
pub async fn record(conn: &mut PgConnection, event: &AuditEvent<'_>) -> Result<(), DomainError> {
    sqlx::query!(
        "INSERT INTO audit_events (account_id, object_id, action, request_id, idempotency_key_id, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
        event.account_id,
        event.object_id,
        event.action,
        event.request_id,
        event.idempotency_key_id,
        event.detail,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// An audit record as an operator reads it.
#[derive(Debug, Clone)]
pub struct AuditLine {
    /// E.g. `payment.created`.
    pub action: String,
    /// `pay_…`, `re_…`
    pub object_id: String,
    /// Anything else worth knowing.
    pub detail: Value,
    /// When (UTC, to the millisecond).
    pub at: String,
}

/// The records written under idempotency key `key_id` (its row id), in order.
pub async fn for_key(
    executor: impl PgExecutor<'_>,
    key_id: i64,
) -> Result<Vec<AuditLine>, DomainError> {
    let lines = sqlx::query_as!(
        AuditLine,
        r#"
        SELECT action, object_id, detail,
               to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS "at!"
          FROM audit_events WHERE idempotency_key_id = $1 ORDER BY id
        "#,
        key_id
    )
    .fetch_all(executor)
    .await?;
    Ok(lines)
}

/// Retention ([`crate::retention`]): of the `limit` records after `id` `after`, deletes those
/// written more than `days` ago.
pub async fn delete_expired(
    executor: impl PgExecutor<'_>,
    after: i64,
    limit: u32,
    days: u32,
) -> Result<Batch, DomainError> {
    let row = sqlx::query!(
        r#"
        WITH head AS (
            SELECT id, created_at < now() - make_interval(days => $3) AS past
              FROM audit_events WHERE id > $1 ORDER BY id LIMIT $2
        ), gone AS (
            DELETE FROM audit_events a USING head h WHERE a.id = h.id AND h.past RETURNING 1
        )
        SELECT (SELECT count(*) FROM gone) AS "deleted!", (SELECT max(id) FROM head) AS last,
               (SELECT count(*) FROM head WHERE past) AS "past!"
        "#,
        after,
        i64::from(limit),
        sql_days(days),
    )
    .fetch_one(executor)
    .await?;
    Ok(Batch::walked(row.deleted, row.last, row.past, limit))
}

/// Stages a job after the commit of the current transaction: `jobs::stage`, under the name the
/// operations call it by until they are rewritten (issue #18).
pub use crate::jobs::stage as stage_job;
