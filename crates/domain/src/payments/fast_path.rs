//! The fast path's SQL, beside the reference road of `store.rs`: a new payment's first phase as one
//! statement that also claims its key ([`insert_claiming`]), and a phase that changes a payment as
//! one statement that ends with the engine's fence ([`update_fenced`]); `batch.rs` holds the
//! set-based form of the second. Each writes what its reference form writes (`payments::insert`,
//! `payments::update` in a fenced transaction); the e2e test `fast_path` holds them to it.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::types::Json;

use super::{
    CancellationReason, CaptureMethod, Changes, NewPayment, Payment, PaymentRow, PaymentStatus,
    RowVersion,
};
use crate::DomainError;
use crate::audit::AuditEvent;
use crate::events::EventType;
use crate::ids::{AccountId, EventId, PaymentId};
use crate::jobs::{JobKind, Work};
use crate::money::{Amount, Currency};

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
    let row = payment_rows_if_any!(
        [r#"
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
        SELECT claim.claimed AS "claimed!: idem::Claimed","#],
        [r#"
               p.row_version
          FROM claim LEFT JOIN payment p ON true
        "#],
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
    let (claimed, stored, version) = (row.claimed, row.id.is_some(), row.row_version);
    if !stored {
        return Ok((claimed, None));
    }
    let payment = payment_if_any!(row)
        .ok_or(DomainError::Corrupt("a payment just inserted with a NULL column"))?;
    if payment.idempotency_key_id.is_none() {
        return Err(DomainError::Corrupt("a fenced payment without its key"));
    }
    let version = version.ok_or(DomainError::Corrupt("a row without xmin"))?;
    Ok((claimed, Some((payment.into(), RowVersion(version)))))
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
               processor_payment_intent_id = coalesce($25, processor_payment_intent_id),
               next_action_url = CASE WHEN $26 THEN $27 ELSE next_action_url END,
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
        changes.processor_payment_intent_id,
        changes.next_action_url.is_some(),
        changes.next_action_url.flatten(),
    )
    .fetch_optional(executor)
    .await?;
    Ok(key_id)
}
