//! The delivery log (`webhook_attempts`): one row per attempt to deliver an event to an
//! endpoint, appended by the worker and read by the API and the inspector.
//!
//! The account sees a coarse outcome of each attempt ([`Failure`]: a timeout, a refused
//! connection, a TLS error, a refused address, or the receiver's status), never the error's
//! text nor how long the attempt took: an account chooses the URL, so an exact error chain and
//! timing would make blind deliveries a port scanner of whatever the worker can reach. The
//! error's text is in the worker's log, for operators, and the duration in the row, for the
//! inspector.

use serde_json::{Value, json};
use sqlx::PgExecutor;

use crate::DomainError;
use crate::ids::{AccountId, EventId, WebhookEndpointId};
use crate::retention::{Batch, sql_days};
use crate::stored::text_enum;

text_enum! {
    /// What became of a delivery after one attempt.
    #[derive(utoipa::ToSchema)]
    #[schema(as = WebhookOutcome)]
    pub enum Outcome {
        /// A 2xx answer: done.
        Delivered,
        /// Failed; another attempt is scheduled.
        Retrying,
        /// Failed past the horizon (or refused by the address rule): dead-lettered.
        Dead,
    }
}

text_enum! {
    /// Why an attempt failed, as the account is shown it.
    #[derive(utoipa::ToSchema)]
    #[schema(as = WebhookFailure)]
    pub enum Failure {
        /// The receiver answered, with a status other than 2xx (the attempt's `status_code`).
        HttpStatus,
        /// No answer within `webhooks.timeout_ms`, connecting included.
        Timeout,
        /// The receiver's host refused (or reset) the connection.
        ConnectionRefused,
        /// The TLS handshake failed: a certificate not valid for the name, or no TLS there.
        TlsError,
        /// The URL's host is, or its name resolves only to, an address webhooks may not reach,
        /// or the name does not resolve at all: the two are one outcome, so that the log does not
        /// tell which internal names exist.
        RefusedAddress,
        /// Any other failure to connect or to read the answer.
        ConnectionError,
    }
}

impl Failure {
    /// The failure a stored `error` shows. Rows written before the log stored classes hold an
    /// error's text, which is never shown: they read as the receiver's status when one came,
    /// else as a connection error.
    fn shown(stored: &str, status_code: Option<i32>) -> Self {
        match crate::stored::from_name(stored) {
            Some(failure) => failure,
            None if status_code.is_some() => Self::HttpStatus,
            None => Self::ConnectionError,
        }
    }
}

/// One attempt, for the delivery log.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    /// The endpoint.
    pub endpoint_id: &'a WebhookEndpointId,
    /// The event.
    pub event_id: &'a EventId,
    /// 1 for the first attempt.
    pub attempt: i32,
    /// The receiver's status, when it answered.
    pub status_code: Option<u16>,
    /// Why it failed, when it did.
    pub failure: Option<Failure>,
    /// How long it took (kept for operators; never shown to the account).
    pub duration_ms: u64,
    /// What became of the delivery.
    pub outcome: Outcome,
}

/// Appends an attempt to the delivery log.
pub async fn log_attempt(
    executor: impl PgExecutor<'_>,
    attempt: &Attempt<'_>,
) -> Result<(), DomainError> {
    sqlx::query!(
        "INSERT INTO webhook_attempts
             (endpoint_id, event_id, attempt, status_code, error, duration_ms, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        attempt.endpoint_id as &WebhookEndpointId,
        attempt.event_id as &EventId,
        attempt.attempt,
        attempt.status_code.map(i32::from),
        attempt.failure.map(|failure| failure.to_string()),
        i64::try_from(attempt.duration_ms).unwrap_or(i64::MAX),
        attempt.outcome as Outcome,
    )
    .execute(executor)
    .await?;
    Ok(())
}

/// The most recent attempts to deliver to an endpoint (its delivery log), newest first, as the
/// API shows them: each failure as its [`Failure`], and no duration.
pub async fn attempts(
    executor: impl PgExecutor<'_>,
    endpoint_id: &WebhookEndpointId,
    limit: i64,
) -> Result<Vec<Value>, DomainError> {
    let rows = sqlx::query!(
        r#"SELECT event_id AS "event_id: EventId", attempt, status_code, error, duration_ms,
                  outcome AS "outcome: Outcome",
                  extract(epoch FROM created_at)::bigint AS "created!"
             FROM webhook_attempts WHERE endpoint_id = $1
            ORDER BY seq DESC LIMIT $2"#,
        endpoint_id as &WebhookEndpointId,
        limit,
    )
    .fetch_all(executor)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            json!({
                "object": "webhook_attempt",
                "event": r.event_id,
                "attempt": r.attempt,
                "status_code": r.status_code,
                "error": r.error.map(|stored| Failure::shown(&stored, r.status_code)),
                "outcome": r.outcome,
                "created": r.created,
            })
        })
        .collect())
}

/// A delivery attempt as an operator sees it, with its endpoint.
#[derive(Debug, Clone)]
pub struct DeliveryLine {
    /// The endpoint.
    pub endpoint_id: WebhookEndpointId,
    /// The endpoint's account.
    pub account_id: AccountId,
    /// The endpoint's URL.
    pub url: String,
    /// The event.
    pub event_id: EventId,
    /// 1 for the first attempt.
    pub attempt: i32,
    /// The receiver's status, when it answered.
    pub status_code: Option<i32>,
    /// Why it failed, when it did: a [`Failure`]'s name (an error's text, in rows written before
    /// the log stored classes).
    pub error: Option<String>,
    /// What became of the delivery.
    pub outcome: Outcome,
    /// How long it took.
    pub duration_ms: i64,
    /// When (UTC).
    pub at: String,
}

/// The newest `limit` attempts to any endpoint, newest first.
pub async fn recent_deliveries(
    executor: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<DeliveryLine>, DomainError> {
    let lines = sqlx::query_as!(
        DeliveryLine,
        r#"
        SELECT a.endpoint_id AS "endpoint_id: _", w.account_id AS "account_id: _", w.url,
               a.event_id AS "event_id: _", a.attempt, a.status_code, a.error,
               a.outcome AS "outcome: _", a.duration_ms,
               to_char(a.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS "at!"
          FROM webhook_attempts a JOIN webhook_endpoints w ON w.id = a.endpoint_id
         ORDER BY a.seq DESC LIMIT $1
        "#,
        limit
    )
    .fetch_all(executor)
    .await?;
    Ok(lines)
}

/// Retention ([`crate::retention`]): of the `limit` attempts after `seq` `after`, deletes those
/// made more than `days` ago.
pub async fn delete_expired_attempts(
    executor: impl PgExecutor<'_>,
    after: i64,
    limit: u32,
    days: u32,
) -> Result<Batch, DomainError> {
    let row = sqlx::query!(
        r#"
        WITH head AS (
            SELECT seq, created_at < now() - make_interval(days => $3) AS past
              FROM webhook_attempts WHERE seq > $1 ORDER BY seq LIMIT $2
        ), gone AS (
            DELETE FROM webhook_attempts a USING head h WHERE a.seq = h.seq AND h.past RETURNING 1
        )
        SELECT (SELECT count(*) FROM gone) AS "deleted!", (SELECT max(seq) FROM head) AS last,
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
