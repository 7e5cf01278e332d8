//! Retention of the processor's events ([`crate::retention`] says why 30 days is safe).

use sqlx::PgExecutor;

use crate::DomainError;
use crate::retention::{Batch, sql_days};

/// Deletes up to `limit` of the events received more than `days` ago, oldest first, by the index
/// on `received_at` (the table's ids are the processor's, in no order of time). The walk goes on
/// (from anywhere: it has no cursor) while a whole batch went.
pub async fn delete_expired(
    executor: impl PgExecutor<'_>,
    limit: u32,
    days: u32,
) -> Result<Batch, DomainError> {
    let deleted = sqlx::query!(
        r#"
        DELETE FROM processor_events
         WHERE id IN (
            SELECT id FROM processor_events
             WHERE received_at < now() - make_interval(days => $2)
             ORDER BY received_at LIMIT $1
             FOR UPDATE SKIP LOCKED)
        "#,
        i64::from(limit),
        sql_days(days),
    )
    .execute(executor)
    .await?
    .rows_affected();
    let deleted = i64::try_from(deleted).unwrap_or(i64::MAX);
    Ok(Batch::walked(deleted, Some(0), deleted, limit))
}
