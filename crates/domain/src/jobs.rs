//! The `jobs` table: work staged in a change's own transaction, to run after its commit at least
//! once (receipts, webhook deliveries, the look at a payment that waits on its customer). Its only SQL but two: `events::record` stages an event's
//! deliveries in the statement that writes the event, which keeps a change at one round trip, and
//! `events::delete_expired` keeps an event while a delivery of it is pending.
//!
//! A job is claimed with `FOR UPDATE SKIP LOCKED` and pushed out of sight for the claim's length
//! (so a runner that dies mid-job lets another take it later); `done` and `failed` are fenced on
//! the claim's attempt number, so a runner whose claim was taken over records nothing.
//!
//! [`claim`] takes every kind but webhook deliveries, oldest due first; deliveries are claimed
//! fairly across accounts and endpoints, under caps, by [`crate::deliveries::claim`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::ids::{EventId, PaymentId, WebhookEndpointId};
use crate::payments::Payment;
use crate::retention::{Batch, sql_days};
use crate::stored::text_enum;

text_enum! {
    /// What a job is, as its `kind` column names it.
    pub enum JobKind {
        /// Send a payment's receipt.
        Receipt,
        /// Deliver an event to a webhook endpoint.
        Webhook,
        /// Ask the processor what became of a payment that waits on its customer.
        Authentication,
    }
}

/// A job's work: its kind with its input, the row's `payload`. The variants are named as
/// [`JobKind`] names them: a row is the externally tagged form of its work split in two columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Work {
    /// Send a payment's receipt.
    Receipt(ReceiptJob),
    /// Deliver an event to an endpoint (staged by `events::record`, in SQL, in this shape).
    Webhook(WebhookJob),
    /// Ask the processor what became of a payment that `requires_action`, if no webhook told us
    /// first, and cancel it once its authentication has expired (`crate::authentication`).
    Authentication(AuthenticationJob),
}

/// The input of an authentication job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthenticationJob {
    /// The payment that waits on its customer.
    pub payment_id: PaymentId,
    /// When its authentication expires (unix seconds): the job then cancels it at the processor.
    pub expires_at: i64,
}

/// The input of a receipt job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptJob {
    /// The payment the receipt is for.
    pub payment_id: PaymentId,
    /// Where it goes.
    pub email: String,
}

/// The input of a webhook delivery job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookJob {
    /// The event delivered.
    pub event_id: EventId,
    /// Where to.
    pub endpoint_id: WebhookEndpointId,
}

impl Work {
    /// The receipt of `payment`, if it asked for one.
    pub fn receipt(payment: &Payment) -> Option<Self> {
        let email = payment.receipt_email.clone()?;
        Some(Self::Receipt(ReceiptJob { payment_id: payment.id.clone(), email }))
    }

    /// Its kind.
    pub fn kind(&self) -> JobKind {
        match self {
            Self::Receipt(_) => JobKind::Receipt,
            Self::Webhook(_) => JobKind::Webhook,
            Self::Authentication(_) => JobKind::Authentication,
        }
    }

    /// What makes staging it twice a no-op: one receipt per payment, one delivery per event and
    /// endpoint, one authentication per payment.
    pub fn dedupe_key(&self) -> String {
        match self {
            Self::Receipt(job) => job.payment_id.to_string(),
            Self::Authentication(job) => job.payment_id.to_string(),
            Self::Webhook(job) => format!("{}:{}", job.event_id, job.endpoint_id),
        }
    }

    /// The input, as the `payload` column holds it.
    pub(crate) fn payload(&self) -> Result<Value, serde_json::Error> {
        match self {
            Self::Receipt(job) => serde_json::to_value(job),
            Self::Webhook(job) => serde_json::to_value(job),
            Self::Authentication(job) => serde_json::to_value(job),
        }
    }

    /// The work a row's `kind` and `payload` name; an error for a kind this code does not know
    /// or a payload that is not that kind's input.
    pub(crate) fn from_stored(kind: &str, payload: Value) -> Result<Self, UnreadableJob> {
        let tagged = Value::Object([(kind.to_owned(), payload)].into_iter().collect());
        serde_json::from_value(tagged)
            .map_err(|err| UnreadableJob { kind: kind.to_owned(), reason: err.to_string() })
    }
}

/// A stored job this code cannot run: a kind it does not know (staged by a newer release, say)
/// or a payload that is not that kind's input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the job of kind `{kind}` does not parse: {reason}")]
pub struct UnreadableJob {
    /// The stored kind.
    pub kind: String,
    /// What serde said.
    pub reason: String,
}

/// A claimed job.
#[derive(Debug)]
pub struct Job {
    /// Its id.
    pub id: i64,
    /// What to do. A job this code cannot read is claimed all the same, and the runner fails it
    /// like any job, so it is retried (a newer release may know it) and then dead-lettered for a
    /// person: never dropped, and never in the way of the jobs behind it.
    pub work: Result<Work, UnreadableJob>,
    /// Attempts so far, this one included.
    pub attempts: i32,
}

impl Job {
    /// A job as a claim's statement returned its row: the work is read from its `kind` and
    /// `payload` as text, so that a row this code cannot read fails as its own job, not as the
    /// claim of every job beside it.
    pub(crate) fn claimed(id: i64, kind: &str, payload: Value, attempts: i32) -> Self {
        Self { id, work: Work::from_stored(kind, payload), attempts }
    }
}

/// Stages a job to run after the commit of the current transaction; staging the same job twice
/// is a no-op.
pub async fn stage(conn: &mut PgConnection, work: &Work) -> Result<(), DomainError> {
    stage_after(conn, work, Duration::ZERO).await
}

/// As [`stage`], for a job that falls due `delay` after now (by the database's clock).
pub async fn stage_after(
    conn: &mut PgConnection,
    work: &Work,
    delay: Duration,
) -> Result<(), DomainError> {
    let payload = work.payload().map_err(|_| DomainError::Corrupt("a job's payload"))?;
    sqlx::query!(
        "INSERT INTO jobs (kind, dedupe_key, payload, run_at)
         VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
         ON CONFLICT (kind, dedupe_key) DO NOTHING",
        work.kind() as JobKind,
        work.dedupe_key(),
        payload,
        delay.as_millis() as f64,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Claims up to `limit` due jobs other than webhook deliveries (receipts, and any kind this code
/// does not know), oldest due first, each for `claim`.
pub async fn claim(
    executor: impl PgExecutor<'_>,
    limit: u32,
    claim: Duration,
) -> Result<Vec<Job>, DomainError> {
    let rows = sqlx::query!(
        r#"
        WITH due AS (
            SELECT id FROM jobs
             WHERE endpoint_id IS NULL AND done_at IS NULL AND dead_at IS NULL
               AND run_at <= now()
             ORDER BY run_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED
        )
        UPDATE jobs j
           SET attempts = j.attempts + 1, run_at = now() + $2 * interval '1 millisecond',
               claimed_until = now() + $2 * interval '1 millisecond'
          FROM due
         WHERE j.id = due.id
        RETURNING j.id, j.kind, j.payload, j.attempts
        "#,
        i64::from(limit),
        claim.as_millis() as f64,
    )
    .fetch_all(executor)
    .await?;
    Ok(rows.into_iter().map(|r| Job::claimed(r.id, &r.kind, r.payload, r.attempts)).collect())
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
        UPDATE jobs SET done_at = now(), last_error = NULL, claimed_until = NULL
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

/// Makes the job of `kind` staged under `dedupe_key` ([`Work::dedupe_key`]) due now, unless it is
/// done, dead, or held by a runner (whose run decides): a payment the processor's webhook settled
/// `failed` has its authentication job brought forward, to close the PaymentIntent the failed
/// attempt left open.
pub async fn bring_forward(
    conn: &mut PgConnection,
    kind: JobKind,
    dedupe_key: &str,
) -> Result<(), DomainError> {
    sqlx::query!(
        "UPDATE jobs SET run_at = now()
          WHERE kind = $1 AND dedupe_key = $2 AND done_at IS NULL AND dead_at IS NULL
            AND claimed_until IS NULL",
        kind as JobKind,
        dedupe_key,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Puts off a job whose claim `attempt` found nothing to do yet (a payment still waiting on its
/// customer): it runs again after `delay`, with no error recorded. The attempts keep counting
/// (they are the claims' fence, which must never repeat); the runner does not dead-letter the
/// jobs that wait. False (nothing recorded) when another runner claimed it since.
pub async fn again(
    executor: impl PgExecutor<'_>,
    id: i64,
    attempt: i32,
    delay: Duration,
) -> Result<bool, DomainError> {
    let later = sqlx::query!(
        r#"
        UPDATE jobs
           SET last_error = NULL, run_at = now() + $3 * interval '1 millisecond',
               claimed_until = NULL
         WHERE id = $1 AND attempts = $2 AND done_at IS NULL AND dead_at IS NULL
        "#,
        id,
        attempt,
        delay.as_millis() as f64,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(later == 1)
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
               dead_at = CASE WHEN $5 THEN now() END, claimed_until = NULL
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

/// Retention ([`crate::retention`]): of the `limit` jobs after `id` `after`, deletes those done
/// more than `done_days` ago and those dead more than `dead_days` ago; a job not finished stays.
/// The walk is over at a job younger than the shorter of the two, which cannot be due yet.
pub async fn delete_expired(
    executor: impl PgExecutor<'_>,
    after: i64,
    limit: u32,
    (done_days, dead_days): (u32, u32),
) -> Result<Batch, DomainError> {
    let row = sqlx::query!(
        r#"
        WITH head AS (
            SELECT id, created_at < now() - make_interval(days => least($3::int, $4::int)) AS past
              FROM jobs WHERE id > $1 ORDER BY id LIMIT $2
        ), gone AS (
            DELETE FROM jobs j USING head h
             WHERE j.id = h.id AND (j.done_at < now() - make_interval(days => $3)
                                    OR j.dead_at < now() - make_interval(days => $4))
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM gone) AS "deleted!", (SELECT max(id) FROM head) AS last,
               (SELECT count(*) FROM head WHERE past) AS "past!"
        "#,
        after,
        i64::from(limit),
        sql_days(done_days),
        sql_days(dead_days),
    )
    .fetch_one(executor)
    .await?;
    Ok(Batch::walked(row.deleted, row.last, row.past, limit))
}

/// A job not done yet, as an operator sees it.
#[derive(Debug, Clone)]
pub struct PendingJob {
    /// Its id.
    pub id: i64,
    /// What kind, as stored: an operator sees a kind this code does not know as it is.
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
