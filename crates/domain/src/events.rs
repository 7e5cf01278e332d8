//! Events, the outbox: one row per state change of a payment or refund, written in the same
//! transaction (the same fenced phase) as the change, so that an event exists exactly when its
//! change committed: a phase that rolls back takes its event with it, and no change commits
//! without one.
//!
//! The same statement stages one `webhook` job per matching endpoint of the account (dedupe key
//! `<event>:<endpoint>`), so the fan-out commits with the event and the worker's staged-job
//! runner delivers it at least once (see [`crate::webhooks`]).

use serde_json::{Value, json};
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::ids::{AccountId, EventId};
use crate::jobs::JobKind;
use crate::payments::Cursor;
use crate::stored::{from_name, text_enum};

text_enum! {
    /// What happened. The names are the public `type` of an event, and the stored one.
    pub enum EventType {
        /// A payment was charged and captured at once.
        PaymentSucceeded = "payment.succeeded",
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
        serde_json::to_vec(&self.to_value()).unwrap_or_default()
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
    // Each job's payload is a `jobs::WebhookJob` and its dedupe key `Work::dedupe_key`'s, built
    // here in SQL so that the fan-out costs no round trip (the worker's delivery tests read
    // them back).
    sqlx::query!(
        r#"
        WITH event AS (
            INSERT INTO events (id, account_id, type, object) VALUES ($1, $2, $3, $4)
            RETURNING id
        )
        INSERT INTO jobs (kind, dedupe_key, payload)
        SELECT $5, event.id || ':' || w.id,
               jsonb_build_object('event_id', event.id, 'endpoint_id', w.id)
          FROM event, webhook_endpoints w
         WHERE w.account_id = $2 AND w.status = 'enabled' AND w.deleted_at IS NULL
           AND ($3 = ANY (w.enabled_events) OR '*' = ANY (w.enabled_events))
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

/// The account's event, if it has one of this id.
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

/// A page of the account's events, newest first (by commit order of insertion), optionally of
/// one type, and whether more lie beyond it. `None` when the cursor names no event of the
/// account.
pub async fn list(
    conn: &mut PgConnection,
    account_id: &AccountId,
    event_type: Option<EventType>,
    limit: i64,
    cursor: Option<&Cursor<EventId>>,
) -> Result<Option<(Vec<Event>, bool)>, DomainError> {
    let position = match cursor {
        None => None,
        Some(Cursor::After(id) | Cursor::Before(id)) => {
            let seq = sqlx::query_scalar!(
                "SELECT seq FROM events WHERE id = $1 AND account_id = $2",
                id as &EventId,
                account_id as &AccountId
            )
            .fetch_optional(&mut *conn)
            .await?;
            match seq {
                None => return Ok(None),
                some => some,
            }
        }
    };
    // Each direction walks (account_id[, type], seq) from the cursor and stops at `limit + 1`
    // rows: the extra row tells whether there is more.
    let backwards = matches!(cursor, Some(Cursor::Before(_)));
    let mut rows = if backwards {
        sqlx::query_as!(
            EventRow,
            r#"SELECT id AS "id: _", account_id AS "account_id: _", type AS "event_type: _",
                      object, extract(epoch FROM created_at)::bigint AS "created!"
                 FROM events
                WHERE account_id = $1 AND ($2::text IS NULL OR type = $2) AND seq > $3
                ORDER BY seq LIMIT $4::bigint + 1"#,
            account_id as &AccountId,
            event_type as Option<EventType>,
            position.unwrap_or(0),
            limit,
        )
        .fetch_all(&mut *conn)
        .await?
    } else {
        sqlx::query_as!(
            EventRow,
            r#"SELECT id AS "id: _", account_id AS "account_id: _", type AS "event_type: _",
                      object, extract(epoch FROM created_at)::bigint AS "created!"
                 FROM events
                WHERE account_id = $1 AND ($2::text IS NULL OR type = $2) AND seq < $3
                ORDER BY seq DESC LIMIT $4::bigint + 1"#,
            account_id as &AccountId,
            event_type as Option<EventType>,
            position.unwrap_or(i64::MAX),
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
