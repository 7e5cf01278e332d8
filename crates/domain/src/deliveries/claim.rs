//! The fair claim of deliveries, and the bulk drop of those nobody is to receive.
//!
//! Both walk the endpoints that have deliveries waiting, one index descent each (a loose scan of
//! `jobs_endpoint_due_idx`, docs/schema.sql), and read each one's oldest due deliveries from the
//! same index: the cost of a pass is bounded by the endpoints with work and the deliveries taken,
//! never by a backlog (the deliveries of a paused endpoint are not read at all).
//!
//! The caps count the deliveries being run (`claimed_until` in the future) by every worker. Two
//! workers counting at once would both see a free place and both take it, so claims are taken
//! one at a time, under a transaction-scoped advisory lock: each claim statement starts after the
//! previous one committed, and sees its claims. `FOR UPDATE SKIP LOCKED` stays, so that no claim
//! takes a job a `done` or `failed` is writing.

use std::time::Duration;

use sqlx::{PgExecutor, PgPool};

use crate::DomainError;
use crate::jobs::Job;

/// The advisory lock key that serialises claims of deliveries (any fixed number: no other lock
/// of this database uses it).
const CLAIM_LOCK: i64 = 0x6465_6c69_7665_7279; // "delivery"

/// The most deliveries run at once, counted across every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// To one endpoint (a probe of a paused endpoint is one, whatever this says).
    pub per_endpoint: u32,
    /// To all the endpoints of one account.
    pub per_account: u32,
}

/// Claims up to `limit` due deliveries, in the fair order and under `caps` (see the module), each
/// for `claim`: the claim also moves `run_at`, so a runner that dies leaves the job due again when
/// the claim runs out.
pub async fn claim(
    pool: &PgPool,
    limit: u32,
    caps: Caps,
    claim: Duration,
) -> Result<Vec<Job>, DomainError> {
    let mut tx = pool.begin().await?;
    sqlx::query!(r#"SELECT 1 AS "locked!" FROM pg_advisory_xact_lock($1)"#, CLAIM_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    let rows = sqlx::query!(
        r#"
        WITH RECURSIVE lanes (endpoint_id) AS (
            (SELECT endpoint_id FROM jobs
              WHERE endpoint_id IS NOT NULL AND done_at IS NULL AND dead_at IS NULL
              ORDER BY endpoint_id LIMIT 1)
            UNION ALL
            SELECT (SELECT j.endpoint_id FROM jobs j
                     WHERE j.endpoint_id > lanes.endpoint_id
                       AND j.done_at IS NULL AND j.dead_at IS NULL
                     ORDER BY j.endpoint_id LIMIT 1)
              FROM lanes WHERE lanes.endpoint_id IS NOT NULL
        ), open AS (
            -- An endpoint no row names is open too: its deliveries fail as jobs, and are
            -- dead-lettered, like any job that names nothing.
            SELECT lanes.endpoint_id, w.account_id,
                   CASE WHEN w.paused_until IS NULL THEN $3::bigint
                        WHEN w.paused_until <= now() THEN 1
                        ELSE 0 END AS places,
                   (SELECT count(*) FROM jobs f
                     WHERE f.endpoint_id = lanes.endpoint_id AND f.claimed_until > now())
                       AS running
              FROM lanes LEFT JOIN webhook_endpoints w ON w.id = lanes.endpoint_id
             WHERE lanes.endpoint_id IS NOT NULL
               AND (w.id IS NULL OR (w.status = 'enabled' AND w.deleted_at IS NULL))
        ), free AS (
            SELECT endpoint_id, account_id, places - running AS endpoint_free,
                   $4::bigint - sum(running) OVER (PARTITION BY account_id)::bigint
                       AS account_free
              FROM open
        ), due AS (
            SELECT d.id, d.run_at, free.account_id, free.account_free
              FROM free CROSS JOIN LATERAL (
                  SELECT j.id, j.run_at FROM jobs j
                   WHERE j.endpoint_id = free.endpoint_id
                     AND j.done_at IS NULL AND j.dead_at IS NULL AND j.run_at <= now()
                   ORDER BY j.run_at, j.id
                   LIMIT greatest(free.endpoint_free, 0)) d
             WHERE free.endpoint_free > 0 AND free.account_free > 0
        ), turns AS (
            SELECT id, account_id, account_free,
                   row_number() OVER (PARTITION BY account_id ORDER BY run_at, id) AS turn,
                   min(run_at) OVER (PARTITION BY account_id) AS waiting_since
              FROM due
        ), picked AS (
            SELECT id FROM turns WHERE turn <= account_free
             ORDER BY turn, waiting_since, account_id
             LIMIT $1
        ), locked AS (
            SELECT id FROM jobs
             WHERE id IN (SELECT id FROM picked)
               AND done_at IS NULL AND dead_at IS NULL AND run_at <= now()
               FOR UPDATE SKIP LOCKED
        )
        UPDATE jobs j
           SET attempts = j.attempts + 1, run_at = now() + $2 * interval '1 millisecond',
               claimed_until = now() + $2 * interval '1 millisecond'
          FROM locked
         WHERE j.id = locked.id
        RETURNING j.id, j.kind, j.payload, j.attempts
        "#,
        i64::from(limit),
        claim.as_millis() as f64,
        i64::from(caps.per_endpoint),
        i64::from(caps.per_account),
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows.into_iter().map(|r| Job::claimed(r.id, &r.kind, r.payload, r.attempts)).collect())
}

/// Marks done, unsent, up to `limit` due deliveries to endpoints disabled or deleted since their
/// event (as Stripe does: a delivery whose endpoint is disabled when its turn comes is not
/// made; one that is enabled again before then still is). Returns how many.
pub async fn drop_undeliverable(
    executor: impl PgExecutor<'_>,
    limit: u32,
) -> Result<u64, DomainError> {
    let dropped = sqlx::query!(
        r#"
        WITH RECURSIVE lanes (endpoint_id) AS (
            (SELECT endpoint_id FROM jobs
              WHERE endpoint_id IS NOT NULL AND done_at IS NULL AND dead_at IS NULL
              ORDER BY endpoint_id LIMIT 1)
            UNION ALL
            SELECT (SELECT j.endpoint_id FROM jobs j
                     WHERE j.endpoint_id > lanes.endpoint_id
                       AND j.done_at IS NULL AND j.dead_at IS NULL
                     ORDER BY j.endpoint_id LIMIT 1)
              FROM lanes WHERE lanes.endpoint_id IS NOT NULL
        ), closed AS (
            SELECT w.id FROM lanes JOIN webhook_endpoints w ON w.id = lanes.endpoint_id
             WHERE w.status <> 'enabled' OR w.deleted_at IS NOT NULL
        ), due AS (
            SELECT j.id FROM jobs j
             WHERE j.endpoint_id IN (SELECT id FROM closed)
               AND j.done_at IS NULL AND j.dead_at IS NULL AND j.run_at <= now()
             LIMIT $1
               FOR UPDATE SKIP LOCKED
        )
        UPDATE jobs SET done_at = now(), last_error = NULL, claimed_until = NULL
          FROM due
         WHERE jobs.id = due.id
        "#,
        i64::from(limit),
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(dropped)
}
