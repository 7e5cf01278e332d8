//! The SQL of the `payments` table: every read and write of a payment goes through here.

use std::collections::BTreeMap;

use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use super::{
    CancellationReason, CaptureMethod, NewPayment, Payment, PaymentRow, PaymentStatus, RowVersion,
};
use crate::DomainError;
use crate::audit::AuditEvent;
use crate::ids::{AccountId, PaymentId};
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
    let row = payment_rows!(
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
        "#,
        r#"
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

/// A payment of the account.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &PaymentId,
) -> Result<Option<Payment>, DomainError> {
    let row = payment_rows!(
        "",
        r#"
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
    let row = payment_rows!(
        "",
        r#"
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
    /// The processor's PaymentIntent recorded for it, once a phase recorded one.
    pub intent_id: Option<String>,
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
                  processor_charge_id AS charge_id,
                  processor_payment_intent_id AS intent_id, status AS "status: _"
             FROM payments WHERE id = $1
              FOR UPDATE"#,
        id as &PaymentId
    )
    .fetch_optional(conn)
    .await?;
    Ok(record)
}

/// Payment `id` of any account (the processor's news and the worker's jobs name a payment by
/// its id alone), locked until the transaction ends.
pub async fn lock_by_id(
    conn: &mut PgConnection,
    id: &PaymentId,
) -> Result<Option<Payment>, DomainError> {
    let row = payment_rows!(
        "",
        r#"
               xmin::text::bigint AS row_version
          FROM payments WHERE id = $1
           FOR UPDATE
        "#,
        id as &PaymentId
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(Payment::from))
}

/// A payment of the account, locked until the transaction ends.
pub async fn lock(
    conn: &mut PgConnection,
    account_id: &AccountId,
    id: &PaymentId,
) -> Result<Option<Payment>, DomainError> {
    let row = payment_rows!(
        "",
        r#"
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
    /// The processor's PaymentIntent.
    pub processor_payment_intent_id: Option<&'a str>,
    /// The processor's charge.
    pub processor_charge_id: Option<&'a str>,
    /// Where the customer authenticates: `Some(None)` removes it.
    pub next_action_url: Option<Option<&'a str>>,
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
    let row = payment_rows!(
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
               processor_payment_intent_id = coalesce($16, processor_payment_intent_id),
               next_action_url = CASE WHEN $17 THEN $18 ELSE next_action_url END,
               updated_at = now()
         WHERE id = $1
        RETURNING *, xmin::text::bigint AS row_version
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT account_id, id, $12, $13, $14, $15 FROM updated WHERE $12::text IS NOT NULL
        )
        "#,
        r#"
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
        changes.processor_payment_intent_id,
        changes.next_action_url.is_some(),
        changes.next_action_url.flatten(),
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
            processor_payment_intent_id: text(
                self.processor_payment_intent_id,
                &payment.processor_payment_intent_id,
            ),
            next_action_url: match self.next_action_url {
                Some(url) => url.map(str::to_owned),
                None => payment.next_action_url.clone(),
            },
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
