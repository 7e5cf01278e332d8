//! Events, the outbox: one row per state change of a payment or refund (and one when the worker
//! disables a failing webhook endpoint), written in the same
//! transaction (the same fenced phase) as the change, so that an event exists exactly when its
//! change committed: a phase that rolls back takes its event with it, and no change commits
//! without one.
//!
//! The same statement stages one `webhook` job per matching endpoint of the account (dedupe key
//! `<event>:<endpoint>`), so the fan-out commits with the event and the worker's staged-job
//! runner delivers it at least once (see [`crate::webhooks`]).
//!
//! The list ([`list`]) is gap-free for a poller: each event records the transaction that wrote
//! it, the list is in the order those transactions began writing, and an event is listed once
//! every transaction that began writing before it has ended (docs/webhooks.md, "The feed's
//! order").

use serde_json::{Value, json};
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::ids::{AccountId, EventId};
use crate::jobs::JobKind;
use crate::payments::Cursor;
use crate::retention::{Batch, sql_days};
use crate::stored::{from_name, text_enum};

text_enum! {
    /// What happened. The names are the public `type` of an event, and the stored one.
    pub enum EventType {
        /// A payment was charged and captured at once.
        PaymentSucceeded = "payment.succeeded",
        /// A payment waits on its customer to authenticate (3-D Secure); its outcome comes later.
        PaymentRequiresAction = "payment.requires_action",
        /// A payment was authorized; a capture is due.
        PaymentRequiresCapture = "payment.requires_capture",
        /// A payment failed (declined, refused by the processor).
        PaymentFailed = "payment.failed",
        /// An authorized payment was captured.
        PaymentCaptured = "payment.captured",
        /// An authorized payment was released.
        PaymentCanceled = "payment.canceled",
        /// A payment's description or metadata changed (`PATCH`).
        PaymentUpdated = "payment.updated",
        /// A refund moved the money back.
        RefundSucceeded = "refund.succeeded",
        /// A refund was refused; the reservation was given back.
        RefundFailed = "refund.failed",
        /// The worker disabled a webhook endpoint that kept failing
        /// (`webhooks.disable_after_hours`); the account enables it again with an update.
        WebhookEndpointDisabled = "webhook_endpoint.disabled",
    }
}

impl EventType {
    /// The type of this public name, such as `payment.succeeded`; `None` for a name no event
    /// has.
    pub fn parse(name: &str) -> Option<Self> {
        from_name(name)
    }
}

/// One event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// `evt_…`
    pub id: EventId,
    /// The account whose object changed.
    pub account_id: AccountId,
    /// What happened.
    pub event_type: EventType,
    /// The object as the API showed it when the change committed.
    pub object: Value,
    /// Unix seconds.
    pub created: i64,
}

impl Event {
    /// The public representation: `{id, object: "event", type, created, data: {object}}`.
    pub fn to_value(&self) -> Value {
        json!({
            "id": self.id,
            "object": "event",
            "type": self.event_type,
            "created": self.created,
            "data": { "object": self.object },
            "livemode": false,
        })
    }

    /// The representation as bytes: the body of a webhook delivery and of `GET /v1/events/{id}`.
    pub fn to_json(&self) -> Vec<u8> {
        self.to_value().to_string().into_bytes()
    }
}

/// Writes the event of a change inside the caller's transaction, and stages its delivery to
/// every enabled endpoint of the account that asked for its type. `object` is the changed
/// object's representation as the API answers it. Returns the event's id.
pub async fn record(
    conn: &mut PgConnection,
    account_id: &AccountId,
    event_type: EventType,
    object: &[u8],
) -> Result<EventId, DomainError> {
    let object: Value =
        serde_json::from_slice(object).map_err(|_| DomainError::Corrupt("an event's object"))?;
    let id = EventId::generate();
    // The deliveries (`webhook_deliveries`, docs/schema.sql) go in the same statement.
    sqlx::query!(
        r#"
        WITH event AS (
            INSERT INTO events (id, account_id, type, object) VALUES ($1, $2, $3, $4)
            RETURNING id
        )
        INSERT INTO jobs (kind, dedupe_key, payload)
        SELECT $5, d.dedupe_key, d.payload FROM event, webhook_deliveries(event.id, $2, $3) d
        ON CONFLICT (kind, dedupe_key) DO NOTHING
        "#,
        &id as &EventId,
        account_id as &AccountId,
        event_type as EventType,
        object,
        JobKind::Webhook as JobKind,
    )
    .execute(conn)
    .await?;
    Ok(id)
}

/// A row of `events`: an unknown type is a decode error.
pub(crate) struct EventRow {
    pub(crate) id: EventId,
    pub(crate) account_id: AccountId,
    pub(crate) event_type: EventType,
    pub(crate) object: Value,
    pub(crate) created: i64,
}

impl From<EventRow> for Event {
    fn from(row: EventRow) -> Self {
        Self {
            id: row.id,
            account_id: row.account_id,
            event_type: row.event_type,
            object: row.object,
            created: row.created,
        }
    }
}

/// The account's event, if it has one of this id: as soon as it is committed, which may be
/// before [`list`] shows it.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &EventId,
) -> Result<Option<Event>, DomainError> {
    let row = sqlx::query_as!(
        EventRow,
        r#"SELECT id AS "id: _", account_id AS "account_id: _", type AS "event_type: _", object,
                  extract(epoch FROM created_at)::bigint AS "created!"
             FROM events WHERE id = $1 AND account_id = $2"#,
        id as &EventId,
        account_id as &AccountId,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Event::from))
}

/// A page of the account's events, newest first, optionally of one type, and whether more lie
/// beyond it. `None` when the cursor names no event of the account.
///
/// The order is the writing transaction's id (the order transactions began writing), then
/// `seq`, not `seq` alone: a transaction that took an earlier seq may commit after one that took
/// a later seq. And only events whose transaction is older than every transaction still running
/// are listed: every event not visible yet has a transaction id at or above that horizon, so it
/// lands ahead of any cursor this list hands out, never behind it, and a poller walking forward
/// with `ending_before` misses none. The price: a write transaction left open anywhere on the
/// database cluster holds back every event after it (delays the list, never reorders it).
/// [`find`] reads an event as soon as it commits.
pub async fn list(
    conn: &mut PgConnection,
    account_id: &AccountId,
    event_type: Option<EventType>,
    limit: i64,
    cursor: Option<&Cursor<EventId>>,
) -> Result<Option<(Vec<Event>, bool)>, DomainError> {
    // The cursor's place in the list's order: its transaction's id (as text: sqlx has no `xid8`)
    // and its seq. A row without an `xid` counts as transaction 0, the oldest; the indexes are on
    // the same expression (docs/schema.sql).
    let position = match cursor {
        None => None,
        Some(Cursor::After(id) | Cursor::Before(id)) => {
            let position = sqlx::query!(
                r#"SELECT coalesce(xid, '0')::text AS "xid!", seq
                     FROM events WHERE id = $1 AND account_id = $2"#,
                id as &EventId,
                account_id as &AccountId
            )
            .fetch_optional(&mut *conn)
            .await?;
            match position {
                None => return Ok(None),
                Some(row) => Some((row.xid, row.seq)),
            }
        }
    };
    // Each direction walks (account_id[, type], xid, seq) from the cursor and stops at
    // `limit + 1` rows: the extra row tells whether there is more. The horizon comes from the
    // statement's own snapshot (`pg_current_snapshot` is the active one), the one its rows are
    // read in: every transaction below it has ended, so what it hides now stays above it.
    let backwards = matches!(cursor, Some(Cursor::Before(_)));
    let mut rows = if backwards {
        let (xid, seq) = position.unwrap_or_else(|| ("0".to_owned(), 0));
        sqlx::query_as!(
            EventRow,
            r#"SELECT id AS "id: _", account_id AS "account_id: _", type AS "event_type: _",
                      object, extract(epoch FROM created_at)::bigint AS "created!"
                 FROM events
                WHERE account_id = $1 AND ($2::text IS NULL OR type = $2)
                  AND coalesce(xid, '0') < pg_snapshot_xmin(pg_current_snapshot())
                  AND (coalesce(xid, '0'), seq) > ($3::text::xid8, $4)
                ORDER BY coalesce(xid, '0'), seq LIMIT $5::bigint + 1"#,
            account_id as &AccountId,
            event_type as Option<EventType>,
            xid,
            seq,
            limit,
        )
        .fetch_all(&mut *conn)
        .await?
    } else {
        // No cursor: from the top of the range (the largest `xid8`), which the horizon bounds.
        let (xid, seq) = position.unwrap_or_else(|| (u64::MAX.to_string(), i64::MAX));
        sqlx::query_as!(
            EventRow,
            r#"SELECT id AS "id: _", account_id AS "account_id: _", type AS "event_type: _",
                      object, extract(epoch FROM created_at)::bigint AS "created!"
                 FROM events
                WHERE account_id = $1 AND ($2::text IS NULL OR type = $2)
                  AND coalesce(xid, '0') < pg_snapshot_xmin(pg_current_snapshot())
                  AND (coalesce(xid, '0'), seq) < ($3::text::xid8, $4)
                ORDER BY coalesce(xid, '0') DESC, seq DESC LIMIT $5::bigint + 1"#,
            account_id as &AccountId,
            event_type as Option<EventType>,
            xid,
            seq,
            limit,
        )
        .fetch_all(&mut *conn)
        .await?
    };
    let has_more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    if backwards {
        rows.reverse();
    }
    Ok(Some((rows.into_iter().map(Event::from).collect(), has_more)))
}

/// How many committed events [`list`] does not show yet: those of transactions at or above its
/// horizon, held back until every transaction that began writing before them has ended. The
/// feed's lag, for an operator; a test waits for it to be 0 before it lists what it wrote.
pub async fn unlisted(executor: impl PgExecutor<'_>) -> Result<i64, DomainError> {
    Ok(sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM events
            WHERE coalesce(xid, '0') >= pg_snapshot_xmin(pg_current_snapshot())"#
    )
    .fetch_one(executor)
    .await?)
}

/// Retention ([`crate::retention`]): of the `limit` events after `seq` `after`, deletes those
/// written more than `days` ago that nothing names any more: no attempt of the delivery log (its
/// foreign key) and no delivery still pending (a `webhook` job, which names its event in its
/// payload and in its dedupe key `<event>:<endpoint>`; the dedupe key's byte order makes an
/// event's deliveries one range of the jobs' unique index).
pub async fn delete_expired(
    executor: impl PgExecutor<'_>,
    after: i64,
    limit: u32,
    days: u32,
) -> Result<Batch, DomainError> {
    let row = sqlx::query!(
        r#"
        WITH head AS (
            SELECT seq, id, created_at < now() - make_interval(days => $3) AS past
              FROM events WHERE seq > $1 ORDER BY seq LIMIT $2
        ), gone AS (
            DELETE FROM events e USING head h
             WHERE e.seq = h.seq AND h.past
               AND NOT EXISTS (SELECT 1 FROM webhook_attempts a WHERE a.event_id = h.id)
               AND NOT EXISTS (
                   SELECT 1 FROM jobs j
                    WHERE j.kind = $4 AND j.dedupe_key >= h.id || ':' AND j.dedupe_key < h.id || ';'
                      AND j.done_at IS NULL AND j.dead_at IS NULL)
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM gone) AS "deleted!", (SELECT max(seq) FROM head) AS last,
               (SELECT count(*) FROM head WHERE past) AS "past!"
        "#,
        after,
        i64::from(limit),
        sql_days(days),
        JobKind::Webhook as JobKind,
    )
    .fetch_one(executor)
    .await?;
    Ok(Batch::walked(row.deleted, row.last, row.past, limit))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_event_type_parses_from_its_own_name_and_no_other() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(&t.to_string()), Some(t));
        }
        assert_eq!(EventType::parse("payment.created"), None);
        assert_eq!(EventType::parse("payment_succeeded"), None);
        assert_eq!(EventType::parse("*"), None);
        assert_eq!(EventType::PaymentRequiresCapture.to_string(), "payment.requires_capture");
    }

    #[test]
    fn an_event_shows_its_object_under_data() {
        let event = Event {
            id: EventId::parse("evt_1").unwrap(),
            account_id: AccountId::parse("acct_1").unwrap(),
            event_type: EventType::PaymentCaptured,
            object: json!({"id": "pay_1", "object": "payment"}),
            created: 7,
        };
        let value = event.to_value();
        assert_eq!(value["type"], "payment.captured");
        assert_eq!(value["object"], "event");
        assert_eq!(value["data"]["object"]["id"], "pay_1");
    }
}
