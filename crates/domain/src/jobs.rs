//! The `jobs` table: work staged in a change's own transaction, to run after its commit at least
//! once (receipts, webhook deliveries). Its only SQL but one: `events::record` stages an event's
//! deliveries in the statement that writes the event, which keeps a change at one round trip.
//!
//! A job is claimed with `FOR UPDATE SKIP LOCKED` and pushed out of sight for the claim's length
//! (so a runner that dies mid-job lets another take it later); `done` and `failed` are fenced on
//! the claim's attempt number, so a runner whose claim was taken over records nothing.

use std::time::Duration;

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;

/// A claimed job.
#[derive(Debug)]
pub struct Job {
    /// Its id.
    pub id: i64,
    /// What kind (`receipt`, `webhook`).
    pub kind: String,
    /// Its input.
    pub payload: Value,
    /// Attempts so far, this one included.
    pub attempts: i32,
}

/// Stages a job to run after the commit of the current transaction; staging the same job twice
/// is a no-op.
pub async fn stage(
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

/// Claims up to `limit` due jobs, each for `claim`.
pub async fn claim(
    executor: impl PgExecutor<'_>,
    limit: u32,
    claim: Duration,
) -> Result<Vec<Job>, DomainError> {
    let jobs = sqlx::query_as!(
        Job,
        r#"
        WITH due AS (
            SELECT id FROM jobs
             WHERE done_at IS NULL AND dead_at IS NULL AND run_at <= now()
             ORDER BY run_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED
        )
        UPDATE jobs j
           SET attempts = j.attempts + 1, run_at = now() + $2 * interval '1 millisecond'
          FROM due
         WHERE j.id = due.id
        RETURNING j.id, j.kind, j.payload, j.attempts
        "#,
        i64::from(limit),
        claim.as_millis() as f64,
    )
    .fetch_all(executor)
    .await?;
    Ok(jobs)
}

/// Marks a job done, if the claim that ran it (`attempt`) is still the job's last one. False when
/// another runner claimed the job since: its run decides.
pub async fn done(
    executor: impl PgExecutor<'_>,
    id: i64,
    attempt: i32,
) -> Result<bool, DomainError> {
    let done = sqlx::query!(
        r#"
        UPDATE jobs SET done_at = now(), last_error = NULL
         WHERE id = $1 AND attempts = $2 AND done_at IS NULL AND dead_at IS NULL
        "#,
        id,
        attempt,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Records a failure of the claim `attempt`: the job runs again after `delay`, or is
/// dead-lettered when `dead`. False (nothing recorded) when another runner claimed it since.
pub async fn failed(
    executor: impl PgExecutor<'_>,
    id: i64,
    attempt: i32,
    error: &str,
    delay: Duration,
    dead: bool,
) -> Result<bool, DomainError> {
    let failed = sqlx::query!(
        r#"
        UPDATE jobs
           SET last_error = $3, run_at = now() + $4 * interval '1 millisecond',
               dead_at = CASE WHEN $5 THEN now() END
         WHERE id = $1 AND attempts = $2 AND done_at IS NULL AND dead_at IS NULL
        "#,
        id,
        attempt,
        error,
        delay.as_millis() as f64,
        dead,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(failed == 1)
}

/// A job not done yet, as an operator sees it.
#[derive(Debug, Clone)]
pub struct PendingJob {
    /// Its id.
    pub id: i64,
    /// What kind.
    pub kind: String,
    /// What it is for (`pay_…`, `evt_…:we_…`).
    pub dedupe_key: String,
    /// Attempts so far.
    pub attempts: i32,
    /// The last failure.
    pub last_error: Option<String>,
    /// Dead-lettered: waits for a person.
    pub dead: bool,
    /// When it runs next (UTC).
    pub run_at: String,
}

/// The newest `limit` jobs staged or dead, newest first.
pub async fn pending(
    executor: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<PendingJob>, DomainError> {
    let jobs = sqlx::query_as!(
        PendingJob,
        r#"
        SELECT id, kind, dedupe_key, attempts, last_error, dead_at IS NOT NULL AS "dead!",
               to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS "run_at!"
          FROM jobs WHERE done_at IS NULL ORDER BY id DESC LIMIT $1
        "#,
        limit
    )
    .fetch_all(executor)
    .await?;
    Ok(jobs)
}
