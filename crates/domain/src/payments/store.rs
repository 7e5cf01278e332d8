//! The SQL of the `payments` table: every read and write of a payment goes through here.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use super::{
    CancellationReason, CaptureMethod, NewPayment, Payment, PaymentRow, PaymentStatus, RowVersion,
};
use crate::DomainError;
use crate::audit::AuditEvent;
use crate::events::EventType;
use crate::ids::{AccountId, EventId, PaymentId};
use crate::jobs::{JobKind, Work};
use crate::money::{Amount, Currency};

/// The first phase's writes: payment `id` of the key `key_id`, `processing`, with its
/// `payment.created` audit record, in the phase's transaction. Returns the payment and its row's
/// version. (`insert_claiming` writes the same on the fast path, with the key's claim.)
pub async fn insert(
    conn: &mut PgConnection,
    id: &PaymentId,
    account_id: &AccountId,
    key_id: i64,
    request_id: &str,
    new: &NewPayment,
) -> Result<(Payment, RowVersion), DomainError> {
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        WITH payment AS (
            INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                                  capture_method, payment_method, description, metadata,
                                  receipt_email)
            VALUES ($1, $2, $3, $4, $5, 'processing', $6, $7, $8, $9, $10)
            RETURNING *, xmin::text::bigint AS row_version
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT account_id, id, 'payment.created', $11, idempotency_key_id,
                   jsonb_build_object('amount', amount, 'currency', currency)
              FROM payment
        )
        SELECT id AS "id: _", account_id AS "account_id: _", idempotency_key_id,
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               capture_method AS "capture_method: _", amount_captured, amount_refunded,
               payment_method, description, metadata AS "metadata: _", receipt_email,
               processor_charge_id, failure_code, failure_message,
               cancellation_reason AS "cancellation_reason: _",
               extract(epoch FROM created_at)::bigint AS "created!",
               row_version
          FROM payment
        "#,
        id as &PaymentId,
        account_id as &AccountId,
        key_id,
        new.amount as Amount,
        new.currency as Currency,
        new.capture_method as CaptureMethod,
        new.payment_method,
        new.description,
        Json(&new.metadata) as Json<&BTreeMap<String, String>>,
        new.receipt_email,
        request_id,
    )
    .fetch_one(conn)
    .await?;
    let version = row.row_version.ok_or(DomainError::Corrupt("a row without xmin"))?;
    Ok((row.into(), RowVersion(version)))
}

/// The first phase of a new payment, as one statement that commits on its own, which also claims
/// the key: `idem_claim` (the idempotency engine's claim, with its fence) reads the key and, when
/// it is new, stores it; only then does the statement insert the payment, `processing`, with its
/// `payment.created` audit record, so that the payment exists exactly when its key records it.
/// For a key the lease holds already the claim is the fence's move. Returns what `idem_claim`
/// answered and, when it stored the key, the payment and its row's version.
pub async fn insert_claiming(
    executor: impl PgExecutor<'_>,
    id: &PaymentId,
    account_id: &AccountId,
    request_id: &str,
    new: &NewPayment,
    claim: idem::ClaimArgs<'_>,
) -> Result<(idem::Claimed, Option<(Payment, RowVersion)>), DomainError> {
    let row = sqlx::query!(
        r#"
        WITH claim AS (
            SELECT idem_claim($11, $12, $13, $14) AS claimed
        ), payment AS (
            INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                                  capture_method, payment_method, description, metadata,
                                  receipt_email)
            SELECT $1, $2, (claimed).id, $3, $4, 'processing', $5, $6, $7, $8, $9
              FROM claim WHERE (claimed).stored
            RETURNING *, xmin::text::bigint AS row_version
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT account_id, id, 'payment.created', $10, idempotency_key_id,
                   jsonb_build_object('amount', amount, 'currency', currency)
              FROM payment
        )
        SELECT claim.claimed AS "claimed!: idem::Claimed",
               p.id AS "id?: PaymentId", p.account_id AS "account_id?: AccountId",
               p.idempotency_key_id, p.amount AS "amount?: Amount",
               p.currency AS "currency?: Currency", p.status AS "status?: PaymentStatus",
               p.capture_method AS "capture_method?: CaptureMethod",
               p.amount_captured AS "amount_captured?", p.amount_refunded AS "amount_refunded?",
               p.payment_method AS "payment_method?", p.description,
               p.metadata AS "metadata?: Json<BTreeMap<String, String>>", p.receipt_email,
               p.processor_charge_id, p.failure_code, p.failure_message,
               p.cancellation_reason AS "cancellation_reason: CancellationReason",
               extract(epoch FROM p.created_at)::bigint AS "created?", p.row_version
          FROM claim LEFT JOIN payment p ON true
        "#,
        id as &PaymentId,
        account_id as &AccountId,
        new.amount as Amount,
        new.currency as Currency,
        new.capture_method as CaptureMethod,
        new.payment_method,
        new.description,
        Json(&new.metadata) as Json<&BTreeMap<String, String>>,
        new.receipt_email,
        request_id,
        claim.account,
        claim.key,
        claim.credential,
        claim.fence as &idem::FenceRecord,
    )
    .fetch_one(executor)
    .await?;
    let Some(id) = row.id else { return Ok((row.claimed, None)) };
    let missing = || DomainError::Corrupt("a payment just inserted with a NULL column");
    let payment = PaymentRow {
        id,
        account_id: row.account_id.ok_or_else(missing)?,
        idempotency_key_id: row.idempotency_key_id,
        amount: row.amount.ok_or_else(missing)?,
        currency: row.currency.ok_or_else(missing)?,
        status: row.status.ok_or_else(missing)?,
        capture_method: row.capture_method.ok_or_else(missing)?,
        amount_captured: row.amount_captured.ok_or_else(missing)?,
        amount_refunded: row.amount_refunded.ok_or_else(missing)?,
        payment_method: row.payment_method.ok_or_else(missing)?,
        description: row.description,
        metadata: row.metadata.ok_or_else(missing)?,
        receipt_email: row.receipt_email,
        processor_charge_id: row.processor_charge_id,
        failure_code: row.failure_code,
        failure_message: row.failure_message,
        cancellation_reason: row.cancellation_reason,
        created: row.created.ok_or_else(missing)?,
        row_version: row.row_version,
    };
    if payment.idempotency_key_id.is_none() {
        return Err(DomainError::Corrupt("a fenced payment without its key"));
    }
    let version = payment.row_version.ok_or(DomainError::Corrupt("a row without xmin"))?;
    Ok((row.claimed, Some((payment.into(), RowVersion(version)))))
}

/// A payment of the account.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &PaymentId,
) -> Result<Option<Payment>, DomainError> {
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        SELECT id AS "id: _", account_id AS "account_id: _", idempotency_key_id,
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               capture_method AS "capture_method: _", amount_captured, amount_refunded,
               payment_method, description, metadata AS "metadata: _", receipt_email,
               processor_charge_id, failure_code, failure_message,
               cancellation_reason AS "cancellation_reason: _",
               extract(epoch FROM created_at)::bigint AS "created!",
               xmin::text::bigint AS row_version
          FROM payments WHERE account_id = $1 AND id = $2
        "#,
        account_id as &AccountId,
        id as &PaymentId
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Payment::from))
}

/// The payment created by an idempotency key.
pub async fn find_by_key(
    executor: impl PgExecutor<'_>,
    key_id: i64,
) -> Result<Option<Payment>, DomainError> {
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        SELECT id AS "id: _", account_id AS "account_id: _", idempotency_key_id,
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               capture_method AS "capture_method: _", amount_captured, amount_refunded,
               payment_method, description, metadata AS "metadata: _", receipt_email,
               processor_charge_id, failure_code, failure_message,
               cancellation_reason AS "cancellation_reason: _",
               extract(epoch FROM created_at)::bigint AS "created!",
               xmin::text::bigint AS row_version
          FROM payments WHERE idempotency_key_id = $1
        "#,
        key_id
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Payment::from))
}

/// What news from the processor about a payment needs to know of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRecord {
    /// The payment's account.
    pub account_id: AccountId,
    /// The idempotency key that creates it (`None` for one created without).
    pub key_id: Option<i64>,
    /// The processor's charge recorded for it, once a phase recorded one.
    pub charge_id: Option<String>,
    /// Its status: `processing` until a phase records its outcome.
    pub status: PaymentStatus,
}

/// Payment `id` (of any account: the processor knows our ids, not our accounts) as news from the
/// processor needs it, locked until the transaction ends: the phase that records a charge locks
/// the same row, so news of a charge and the record of another one cannot pass each other
/// unseen (`processor_events::receive`).
pub async fn lock_for_news(
    conn: &mut PgConnection,
    id: &PaymentId,
) -> Result<Option<ChargeRecord>, DomainError> {
    let record = sqlx::query_as!(
        ChargeRecord,
        r#"SELECT account_id AS "account_id: _", idempotency_key_id AS key_id,
                  processor_charge_id AS charge_id, status AS "status: _"
             FROM payments WHERE id = $1
              FOR UPDATE"#,
        id as &PaymentId
    )
    .fetch_optional(conn)
    .await?;
    Ok(record)
}

/// A payment of the account, locked until the transaction ends.
pub async fn lock(
    conn: &mut PgConnection,
    account_id: &AccountId,
    id: &PaymentId,
) -> Result<Option<Payment>, DomainError> {
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        SELECT id AS "id: _", account_id AS "account_id: _", idempotency_key_id,
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               capture_method AS "capture_method: _", amount_captured, amount_refunded,
               payment_method, description, metadata AS "metadata: _", receipt_email,
               processor_charge_id, failure_code, failure_message,
               cancellation_reason AS "cancellation_reason: _",
               extract(epoch FROM created_at)::bigint AS "created!",
               xmin::text::bigint AS row_version
          FROM payments WHERE account_id = $1 AND id = $2
           FOR UPDATE
        "#,
        account_id as &AccountId,
        id as &PaymentId
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(Payment::from))
}

/// The changes a phase makes to a payment; `None` leaves a column as it is.
#[derive(Debug, Default)]
pub struct Changes<'a> {
    /// New status.
    pub status: Option<PaymentStatus>,
    /// New captured amount.
    pub amount_captured: Option<i64>,
    /// Added to the refunded amount (negative to give a reservation back).
    pub refunded_delta: i64,
    /// The processor's charge.
    pub processor_charge_id: Option<&'a str>,
    /// Decline code.
    pub failure_code: Option<&'a str>,
    /// Decline message.
    pub failure_message: Option<&'a str>,
    /// Cancel reason.
    pub cancellation_reason: Option<CancellationReason>,
    /// New description: `Some(None)` removes it.
    pub description: Option<Option<&'a str>>,
    /// New metadata.
    pub metadata: Option<&'a BTreeMap<String, String>>,
}

/// Applies `changes` and returns the payment as it now is; with `audit`, writes that audit
/// record in the same statement.
pub async fn update(
    conn: &mut PgConnection,
    id: &PaymentId,
    changes: &Changes<'_>,
    audit: Option<&AuditEvent<'_>>,
) -> Result<Payment, DomainError> {
    // The `SET` is `update_fenced`'s too (and `Changes::apply`'s): change the three together.
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        WITH updated AS (
        UPDATE payments
           SET status = coalesce($2, status),
               amount_captured = coalesce($3, amount_captured),
               amount_refunded = amount_refunded + $4,
               processor_charge_id = coalesce($5, processor_charge_id),
               failure_code = coalesce($6, failure_code),
               failure_message = coalesce($7, failure_message),
               cancellation_reason = coalesce($8, cancellation_reason),
               description = CASE WHEN $9 THEN $10 ELSE description END,
               metadata = coalesce($11, metadata),
               updated_at = now()
         WHERE id = $1
        RETURNING *, xmin::text::bigint AS row_version
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT account_id, id, $12, $13, $14, $15 FROM updated WHERE $12::text IS NOT NULL
        )
        SELECT id AS "id: _", account_id AS "account_id: _", idempotency_key_id,
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               capture_method AS "capture_method: _", amount_captured, amount_refunded,
               payment_method, description, metadata AS "metadata: _", receipt_email,
               processor_charge_id, failure_code, failure_message,
               cancellation_reason AS "cancellation_reason: _",
               extract(epoch FROM created_at)::bigint AS "created!",
               row_version
          FROM updated
        "#,
        id as &PaymentId,
        changes.status as Option<PaymentStatus>,
        changes.amount_captured,
        changes.refunded_delta,
        changes.processor_charge_id,
        changes.failure_code,
        changes.failure_message,
        changes.cancellation_reason as Option<CancellationReason>,
        changes.description.is_some(),
        changes.description.flatten(),
        changes.metadata.map(Json) as Option<Json<&BTreeMap<String, String>>>,
        audit.map(|event| event.action),
        audit.map(|event| event.request_id),
        audit.map(|event| event.idempotency_key_id),
        audit.map(|event| &event.detail),
    )
    .fetch_one(conn)
    .await?;
    Ok(row.into())
}

impl Changes<'_> {
    /// `payment` as [`update`] leaves it: what the statement's `SET` does, column by column.
    pub fn apply(&self, payment: &Payment) -> Payment {
        let text = |new: Option<&str>, old: &Option<String>| new.map(str::to_owned).or(old.clone());
        Payment {
            status: self.status.unwrap_or(payment.status),
            amount_captured: self.amount_captured.unwrap_or(payment.amount_captured),
            amount_refunded: payment.amount_refunded + self.refunded_delta,
            processor_charge_id: text(self.processor_charge_id, &payment.processor_charge_id),
            failure_code: text(self.failure_code, &payment.failure_code),
            failure_message: text(self.failure_message, &payment.failure_message),
            cancellation_reason: self.cancellation_reason.or(payment.cancellation_reason),
            description: match self.description {
                Some(description) => description.map(str::to_owned),
                None => payment.description.clone(),
            },
            metadata: self.metadata.cloned().unwrap_or_else(|| payment.metadata.clone()),
            ..payment.clone()
        }
    }
}

/// What a phase of one statement writes beside the payment's changes.
#[derive(Debug)]
pub struct Written<'a> {
    /// The audit record of the change.
    pub audit: &'a AuditEvent<'a>,
    /// A job to stage with it (staging it twice is a no-op, as `jobs::stage`).
    pub job: Option<&'a Work>,
    /// The event the change makes, with the payment's representation as it now is (its
    /// webhook deliveries are staged with it, as `events::record` does).
    pub event: (EventType, &'a [u8]),
}

/// A phase that changes a payment, as one statement that commits on its own: applies `changes`
/// to payment `id` if its row is still at `version`, writes what `written` says, and ends the
/// phase with `idem_commit_fence(fence)` (the engine's fence, which may store the answer the
/// caller computed from the row at `version` with [`Changes::apply`]). Returns the key id the
/// fence returned, or `None`, having written nothing, when the row has changed since `version`
/// (the caller then runs the phase the general way, from the row as it is).
pub async fn update_fenced(
    executor: impl PgExecutor<'_>,
    id: &PaymentId,
    version: RowVersion,
    changes: &Changes<'_>,
    written: &Written<'_>,
    fence: &idem::FenceRecord,
) -> Result<Option<i64>, DomainError> {
    let job = written.job;
    let payload =
        job.map(Work::payload).transpose().map_err(|_| DomainError::Corrupt("a job's payload"))?;
    let (event_type, object) = written.event;
    let object: Value =
        serde_json::from_slice(object).map_err(|_| DomainError::Corrupt("an event's object"))?;
    let audit = written.audit;
    // The same `SET` as `update`'s (which `Changes::apply` mirrors; `stored.rs` checks the two,
    // and a new payment's answer read back byte for byte checks this one, in `payments.rs`).
    // Every write reads `updated`, so a row that moved on (no row there) writes nothing, and the
    // fence is not called. The webhook fan-out is `events::record`'s.
    let key_id = sqlx::query_scalar!(
        r#"
        WITH updated AS (
        UPDATE payments
           SET status = coalesce($3, status),
               amount_captured = coalesce($4, amount_captured),
               amount_refunded = amount_refunded + $5,
               processor_charge_id = coalesce($6, processor_charge_id),
               failure_code = coalesce($7, failure_code),
               failure_message = coalesce($8, failure_message),
               cancellation_reason = coalesce($9, cancellation_reason),
               description = CASE WHEN $10 THEN $11 ELSE description END,
               metadata = coalesce($12, metadata),
               updated_at = now()
         WHERE id = $1 AND xmin::text::bigint = $2
        RETURNING account_id, id
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT account_id, id, $13, $14, $15, $16 FROM updated
        ), job AS (
            INSERT INTO jobs (kind, dedupe_key, payload)
            SELECT $17, $18, $19 FROM updated WHERE $17::text IS NOT NULL
            ON CONFLICT (kind, dedupe_key) DO NOTHING
        ), event AS (
            INSERT INTO events (id, account_id, type, object)
            SELECT $20, account_id, $21, $22 FROM updated
            RETURNING id, account_id, type
        ), deliveries AS (
            INSERT INTO jobs (kind, dedupe_key, payload)
            SELECT $23, d.dedupe_key, d.payload
              FROM event, webhook_deliveries(event.id, event.account_id, event.type) d
            ON CONFLICT (kind, dedupe_key) DO NOTHING
        )
        SELECT idem_commit_fence($24) AS "key_id!" FROM updated
        "#,
        id as &PaymentId,
        version.0,
        changes.status as Option<PaymentStatus>,
        changes.amount_captured,
        changes.refunded_delta,
        changes.processor_charge_id,
        changes.failure_code,
        changes.failure_message,
        changes.cancellation_reason as Option<CancellationReason>,
        changes.description.is_some(),
        changes.description.flatten(),
        changes.metadata.map(Json) as Option<Json<&BTreeMap<String, String>>>,
        audit.action,
        audit.request_id,
        audit.idempotency_key_id,
        &audit.detail,
        job.map(Work::kind) as Option<JobKind>,
        job.map(Work::dedupe_key),
        payload,
        &EventId::generate() as &EventId,
        event_type as EventType,
        object,
        JobKind::Webhook as JobKind,
        fence as &idem::FenceRecord,
    )
    .fetch_optional(executor)
    .await?;
    Ok(key_id)
}

/// Which side of a cursor a page lies on: the cursor is an object of the list, by its id.
#[derive(Debug, Clone)]
pub enum Cursor<Id> {
    /// Older than this id.
    After(Id),
    /// Newer than this id.
    Before(Id),
}

impl<Id> Cursor<Id> {
    /// The id, as `(starting_after, ending_before)`.
    pub(crate) fn sides(cursor: Option<&Self>) -> (Option<&Id>, Option<&Id>) {
        match cursor {
            None => (None, None),
            Some(Cursor::After(id)) => (Some(id), None),
            Some(Cursor::Before(id)) => (None, Some(id)),
        }
    }
}

/// A page of the account's payments, newest first, and whether more lie beyond it. `None` when
/// the cursor names no payment of the account.
pub async fn list(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    limit: i64,
    cursor: Option<&Cursor<PaymentId>>,
) -> Result<Option<(Vec<Payment>, bool)>, DomainError> {
    let (after, before) = Cursor::sides(cursor);
    // One statement: the cursor's position, whether it exists, and the page (one extra row tells
    // whether there is more), ordered by (created_at, seq). Each direction is its own branch, a
    // walk of (account_id, created_at DESC, seq DESC) from the cursor that stops at `limit + 1`
    // rows; the branches not asked for are switched off by a one-time filter on the parameters
    // (no `ORDER BY CASE`, which would sort the whole account). The cursor's position is given
    // as scalar subqueries, so that it becomes the index scan's start rather than a join filter
    // over every newer row. Going backwards reads ascending and is turned around below.
    let rows = sqlx::query!(
        r#"
        WITH cursor AS (
            SELECT created_at, seq FROM payments
             WHERE account_id = $1 AND id = coalesce($3, $4)
        )
        SELECT p.seq AS "seq?",
               (extract(epoch FROM p.created_at) * 1000000)::bigint AS "created_us?",
               p.id AS "id?: PaymentId", p.account_id AS "account_id?: AccountId",
               p.idempotency_key_id, p.amount AS "amount?: Amount",
               p.currency AS "currency?: Currency", p.status AS "status?: PaymentStatus",
               p.capture_method AS "capture_method?: CaptureMethod",
               p.amount_captured AS "amount_captured?", p.amount_refunded AS "amount_refunded?",
               p.payment_method AS "payment_method?", p.description,
               p.metadata AS "metadata?: Json<BTreeMap<String, String>>",
               p.receipt_email, p.processor_charge_id, p.failure_code, p.failure_message,
               p.cancellation_reason AS "cancellation_reason?: CancellationReason",
               extract(epoch FROM p.created_at)::bigint AS "created?",
               (coalesce($3, $4) IS NULL OR EXISTS (SELECT 1 FROM cursor)) AS "cursor_found!"
          FROM (SELECT 1) one
          LEFT JOIN LATERAL (
              (SELECT * FROM payments
                WHERE $3::text IS NULL AND $4::text IS NULL AND account_id = $1
                ORDER BY created_at DESC, seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM payments q
                WHERE $3::text IS NOT NULL AND q.account_id = $1
                  AND (q.created_at, q.seq)
                      < ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at DESC, q.seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM payments q
                WHERE $4::text IS NOT NULL AND q.account_id = $1
                  AND (q.created_at, q.seq)
                      > ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at, q.seq
                LIMIT $2::bigint + 1)
          ) p ON true
        "#,
        account_id as &AccountId,
        limit,
        after as Option<&PaymentId>,
        before as Option<&PaymentId>,
    )
    .fetch_all(executor)
    .await?;
    if !rows.first().is_some_and(|r| r.cursor_found) {
        return Ok(None);
    }
    let mut payments = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for r in rows {
        let (
            Some(id),
            Some(account_id),
            Some(amount),
            Some(currency),
            Some(status),
            Some(capture_method),
            Some(metadata),
        ) = (r.id, r.account_id, r.amount, r.currency, r.status, r.capture_method, r.metadata)
        else {
            continue; // the LEFT JOIN's empty row: no payments on this page
        };
        positions.push((r.created_us.unwrap_or_default(), r.seq.unwrap_or_default()));
        payments.push(Payment::from(PaymentRow {
            id,
            account_id,
            idempotency_key_id: r.idempotency_key_id,
            amount,
            currency,
            status,
            capture_method,
            amount_captured: r.amount_captured.unwrap_or_default(),
            amount_refunded: r.amount_refunded.unwrap_or_default(),
            payment_method: r.payment_method.unwrap_or_default(),
            description: r.description,
            metadata,
            receipt_email: r.receipt_email,
            processor_charge_id: r.processor_charge_id,
            failure_code: r.failure_code,
            failure_message: r.failure_message,
            cancellation_reason: r.cancellation_reason,
            created: r.created.unwrap_or_default(),
            row_version: None,
        }));
    }
    let payments = in_walk_order(payments, positions, before.is_some());
    Ok(Some(finish_page(payments, limit, before.is_some())))
}

/// Rows in the order their branch walked them (newest first; oldest first going backwards):
/// the order of a `UNION ALL` is not promised, so it is restored from each row's position.
pub(crate) fn in_walk_order<T>(
    items: Vec<T>,
    positions: Vec<(i64, i64)>,
    backwards: bool,
) -> Vec<T> {
    let mut keyed: Vec<_> = positions.into_iter().zip(items).collect();
    keyed.sort_by(|(a, _), (b, _)| if backwards { a.cmp(b) } else { b.cmp(a) });
    keyed.into_iter().map(|(_, item)| item).collect()
}

/// A page read with one row more than `limit`: trimmed, with whether there is more, newest
/// first (a page read backwards, oldest first, is turned around).
pub(crate) fn finish_page<T>(mut items: Vec<T>, limit: i64, backwards: bool) -> (Vec<T>, bool) {
    let limit = usize::try_from(limit).unwrap_or(0);
    let has_more = items.len() > limit;
    items.truncate(limit);
    if backwards {
        items.reverse();
    }
    (items, has_more)
}
