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
use crate::ids;
use crate::payments::Cursor;

/// What happened. The names are the public `type` of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// A payment was charged and captured at once.
    PaymentSucceeded,
    /// A payment was authorized; a capture is due.
    PaymentRequiresCapture,
    /// A payment failed (declined, refused by the processor).
    PaymentFailed,
    /// An authorized payment was captured.
    PaymentCaptured,
    /// An authorized payment was released.
    PaymentCanceled,
    /// A payment's description or metadata changed (`PATCH`).
    PaymentUpdated,
    /// A refund moved the money back.
    RefundSucceeded,
    /// A refund was refused; the reservation was given back.
    RefundFailed,
}

impl EventType {
    /// Every type, in the documented order.
    pub const ALL: [Self; 8] = [
        Self::PaymentSucceeded,
        Self::PaymentRequiresCapture,
        Self::PaymentFailed,
        Self::PaymentCaptured,
        Self::PaymentCanceled,
        Self::PaymentUpdated,
        Self::RefundSucceeded,
        Self::RefundFailed,
    ];

    /// The public name, such as `payment.succeeded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PaymentSucceeded => "payment.succeeded",
            Self::PaymentRequiresCapture => "payment.requires_capture",
            Self::PaymentFailed => "payment.failed",
            Self::PaymentCaptured => "payment.captured",
            Self::PaymentCanceled => "payment.canceled",
            Self::PaymentUpdated => "payment.updated",
            Self::RefundSucceeded => "refund.succeeded",
            Self::RefundFailed => "refund.failed",
        }
    }

    /// The type of this name; `None` for a name no event has.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

/// One event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// `evt_…`
    pub id: String,
    /// The account whose object changed.
    pub account_id: String,
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
            "type": self.event_type.as_str(),
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
    account_id: &str,
    event_type: EventType,
    object: &[u8],
) -> Result<String, DomainError> {
    let object: Value =
        serde_json::from_slice(object).map_err(|_| DomainError::Corrupt("an event's object"))?;
    let id = ids::new_id("evt");
    sqlx::query!(
        r#"
        WITH event AS (
            INSERT INTO events (id, account_id, type, object) VALUES ($1, $2, $3, $4)
            RETURNING id
        )
        INSERT INTO jobs (kind, dedupe_key, payload)
        SELECT 'webhook', event.id || ':' || w.id,
               jsonb_build_object('event_id', event.id, 'endpoint_id', w.id)
          FROM event, webhook_endpoints w
         WHERE w.account_id = $2 AND w.status = 'enabled' AND w.deleted_at IS NULL
           AND ($3 = ANY (w.enabled_events) OR '*' = ANY (w.enabled_events))
        ON CONFLICT (kind, dedupe_key) DO NOTHING
        "#,
        id,
        account_id,
        event_type.as_str(),
        object,
    )
    .execute(conn)
    .await?;
    Ok(id)
}

struct EventRow {
    id: String,
    account_id: String,
    kind: String,
    object: Value,
    created: i64,
}

impl Event {
    /// An event from its stored columns; an unknown type is a corrupt record.
    pub(crate) fn try_from_parts(
        id: String,
        account_id: String,
        kind: &str,
        object: Value,
        created: i64,
    ) -> Result<Self, DomainError> {
        let event_type = EventType::parse(kind).ok_or(DomainError::Corrupt("events.type"))?;
        Ok(Self { id, account_id, event_type, object, created })
    }
}

impl TryFrom<EventRow> for Event {
    type Error = DomainError;

    fn try_from(row: EventRow) -> Result<Self, DomainError> {
        Self::try_from_parts(row.id, row.account_id, &row.kind, row.object, row.created)
    }
}

/// The account's event, if it has one of this id.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &str,
    id: &str,
) -> Result<Option<Event>, DomainError> {
    let row = sqlx::query_as!(
        EventRow,
        r#"SELECT id, account_id, type AS kind, object,
                  extract(epoch FROM created_at)::bigint AS "created!"
             FROM events WHERE id = $1 AND account_id = $2"#,
        id,
        account_id,
    )
    .fetch_optional(executor)
    .await?;
    row.map(Event::try_from).transpose()
}

/// A page of the account's events, newest first (by commit order of insertion), optionally of
/// one type, and whether more lie beyond it. `None` when the cursor names no event of the
/// account.
pub async fn list(
    conn: &mut PgConnection,
    account_id: &str,
    event_type: Option<EventType>,
    limit: i64,
    cursor: Option<&Cursor>,
) -> Result<Option<(Vec<Event>, bool)>, DomainError> {
    let kind = event_type.map(EventType::as_str);
    let position = match cursor {
        None => None,
        Some(Cursor::After(id) | Cursor::Before(id)) => {
            let seq = sqlx::query_scalar!(
                "SELECT seq FROM events WHERE id = $1 AND account_id = $2",
                id,
                account_id
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
            r#"SELECT id, account_id, type AS kind, object,
                      extract(epoch FROM created_at)::bigint AS "created!"
                 FROM events
                WHERE account_id = $1 AND ($2::text IS NULL OR type = $2) AND seq > $3
                ORDER BY seq LIMIT $4::bigint + 1"#,
            account_id,
            kind,
            position.unwrap_or(0),
            limit,
        )
        .fetch_all(&mut *conn)
        .await?
    } else {
        sqlx::query_as!(
            EventRow,
            r#"SELECT id, account_id, type AS kind, object,
                      extract(epoch FROM created_at)::bigint AS "created!"
                 FROM events
                WHERE account_id = $1 AND ($2::text IS NULL OR type = $2) AND seq < $3
                ORDER BY seq DESC LIMIT $4::bigint + 1"#,
            account_id,
            kind,
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
    let events = rows.into_iter().map(Event::try_from).collect::<Result<Vec<_>, _>>()?;
    Ok(Some((events, has_more)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_type_parses_from_its_own_name_and_no_other() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
        }
        assert_eq!(EventType::parse("payment.created"), None);
        assert_eq!(EventType::parse("*"), None);
    }

    #[test]
    fn an_event_shows_its_object_under_data() {
        let event = Event {
            id: "evt_1".into(),
            account_id: "acct_1".into(),
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
