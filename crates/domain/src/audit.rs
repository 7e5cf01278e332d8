//! The audit trail: who did what to which object, from which request and key, when.

use serde_json::Value;
use sqlx::PgConnection;

use crate::DomainError;

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

/// Stages a job to run after the commit of the current transaction; staging the same job twice
/// is a no-op.
pub async fn stage_job(
    conn: &mut PgConnection,
    kind: &str,
    dedupe_key: &str,
    payload: Value,
) -> Result<(), DomainError> {
    sqlx::query!(
        "INSERT INTO jobs (kind, dedupe_key, payload) VALUES ($1, $2, $3)
         ON CONFLICT (kind, dedupe_key) DO NOTHING",
        kind,
        dedupe_key,
        payload,
    )
    .execute(conn)
    .await?;
    Ok(())
}
