//! The last phase of new payments whose charge the processor answered, many in one statement
//! (`idem::batch`): what [`update_fenced`] writes for one such payment, for each row of a batch.
//!
//! [`update_fenced`]: super::update_fenced

use serde_json::Value;
use sqlx::PgConnection;

use super::{Changes, PaymentStatus, RowVersion, Written};
use crate::DomainError;
use crate::audit::AuditEvent;
use crate::events::EventType;
use crate::ids::{EventId, PaymentId};
use crate::jobs::{JobKind, Work};

/// One payment's row of a batch: the changes of a charge recorded (its status, the amount
/// captured, the PaymentIntent and its charge), at the row's version the first phase wrote, with what `Written` says.
#[derive(Debug)]
pub struct ChargedRow {
    id: PaymentId,
    version: RowVersion,
    status: PaymentStatus,
    amount_captured: i64,
    intent_id: String,
    charge_id: Option<String>,
    account_id: String,
    action: String,
    request_id: String,
    key_id: i64,
    detail: Value,
    job: Option<Work>,
    event: EventType,
    object: Vec<u8>,
}

impl ChargedRow {
    /// The row for `changes` to the payment `id` at `version`, with what is `written` beside
    /// them; `None` when the changes are not only a status, an amount captured, a PaymentIntent
    /// and its charge (the batch's statement sets nothing else).
    pub fn new(
        id: &PaymentId,
        version: RowVersion,
        changes: &Changes<'_>,
        written: &Written<'_>,
    ) -> Option<Self> {
        let Changes {
            status: Some(status),
            amount_captured: Some(amount_captured),
            processor_payment_intent_id: Some(intent_id),
            processor_charge_id: charge_id,
            refunded_delta: 0,
            failure_code: None,
            failure_message: None,
            cancellation_reason: None,
            description: None,
            metadata: None,
            next_action_url: None,
        } = *changes
        else {
            return None;
        };
        let (event, object) = written.event;
        Some(Self {
            id: id.clone(),
            version,
            status,
            amount_captured,
            intent_id: intent_id.to_owned(),
            charge_id: charge_id.map(str::to_owned),
            account_id: written.audit.account_id.to_owned(),
            action: written.audit.action.to_owned(),
            request_id: written.audit.request_id.to_owned(),
            key_id: written.audit.idempotency_key_id,
            detail: written.audit.detail.clone(),
            job: written.job.cloned(),
            event,
            object: object.to_vec(),
        })
    }

    /// The row's phase as the statement of one phase: [`update_fenced`] with the same values.
    ///
    /// [`update_fenced`]: super::update_fenced
    async fn alone(
        &self,
        connection: &mut PgConnection,
        fence: &idem::FenceRecord,
    ) -> Result<Option<i64>, DomainError> {
        let changes = Changes {
            status: Some(self.status),
            amount_captured: Some(self.amount_captured),
            processor_payment_intent_id: Some(&self.intent_id),
            processor_charge_id: self.charge_id.as_deref(),
            ..Changes::default()
        };
        let audit = AuditEvent {
            account_id: &self.account_id,
            object_id: &self.id,
            action: &self.action,
            request_id: &self.request_id,
            idempotency_key_id: self.key_id,
            detail: self.detail.clone(),
        };
        let written =
            Written { audit: &audit, job: self.job.as_ref(), event: (self.event, &self.object) };
        super::update_fenced(connection, &self.id, self.version, &changes, &written, fence).await
    }
}

/// The batched statement of [`ChargedRow`]s. A batch of one row is sent as the statement of one
/// phase ([`update_fenced`](super::update_fenced)): the batch's form costs Postgres more for a
/// single row (its `unnest` and the joins back to it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Charged;

impl idem::batch::Batch for Charged {
    type Row = ChargedRow;

    async fn send(
        &self,
        connection: &mut PgConnection,
        rows: &[(ChargedRow, idem::FenceRecord)],
    ) -> Result<Vec<Option<i64>>, sqlx::Error> {
        let sent = match rows {
            [(row, fence)] => row.alone(connection, fence).await.map(|key_id| vec![key_id]),
            _ => charge_many(connection, rows).await,
        };
        sent.map_err(|err| match err {
            DomainError::Database(err) => err,
            other => sqlx::Error::Protocol(other.to_string()),
        })
    }
}

/// [`update_fenced`] for many payments in one statement, each row as that statement writes it:
/// the payment's update at its version, its audit record, its receipt job, its event and the
/// event's webhook deliveries, and its fence (`idem_commit_fence`, which raises `IL001` for a
/// lost lease and so fails the whole statement). A row whose payment moved on writes nothing and
/// is `None`. Answers the key ids in the rows' order.
///
/// [`update_fenced`]: super::update_fenced
async fn charge_many(
    connection: &mut PgConnection,
    rows: &[(ChargedRow, idem::FenceRecord)],
) -> Result<Vec<Option<i64>>, DomainError> {
    let text = |f: fn(&ChargedRow) -> String| -> Vec<String> {
        rows.iter().map(|(row, _)| f(row)).collect()
    };
    let number =
        |f: fn(&ChargedRow) -> i64| -> Vec<i64> { rows.iter().map(|(row, _)| f(row)).collect() };
    let job = |f: fn(&Work) -> String| -> Vec<Option<String>> {
        rows.iter().map(|(row, _)| row.job.as_ref().map(f)).collect()
    };
    let mut payloads = Vec::with_capacity(rows.len());
    let mut objects = Vec::with_capacity(rows.len());
    for (row, _) in rows {
        let payload = row.job.as_ref().map(Work::payload).transpose();
        payloads.push(payload.map_err(|_| DomainError::Corrupt("a job's payload"))?);
        let object: Value = serde_json::from_slice(&row.object)
            .map_err(|_| DomainError::Corrupt("an event's object"))?;
        objects.push(object);
    }
    let details: Vec<Value> = rows.iter().map(|(row, _)| row.detail.clone()).collect();
    let fences: Vec<idem::FenceRecord> = rows.iter().map(|(_, fence)| fence.clone()).collect();
    let (ids, statuses) = (text(|row| row.id.to_string()), text(|row| row.status.to_string()));
    let intents = text(|row| row.intent_id.clone());
    let charges: Vec<Option<String>> = rows.iter().map(|(row, _)| row.charge_id.clone()).collect();
    let (actions, requests) = (text(|row| row.action.clone()), text(|row| row.request_id.clone()));
    let event_ids = text(|_| EventId::generate().to_string());
    let event_types = text(|row| row.event.to_string());
    let (versions, captured) = (number(|row| row.version.0), number(|row| row.amount_captured));
    let key_ids = number(|row| row.key_id);
    let (job_kinds, job_keys) = (job(|work| work.kind().to_string()), job(Work::dedupe_key));
    // `update_fenced`'s statement with a row per payment: every write reads `updated`, so a
    // payment that moved on writes nothing and calls no fence. The `SET` is `update`'s for these
    // changes alone (`ChargedRow::new` takes no others).
    let written = sqlx::query!(
        r#"
        WITH input AS (
            SELECT *
              FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $5::text[],
                          $6::text[], $7::text[], $8::int8[], $9::jsonb[], $10::text[],
                          $11::text[], $12::jsonb[], $13::text[], $14::text[], $15::jsonb[],
                          $18::text[])
                   WITH ORDINALITY AS t(payment_id, version, status, amount_captured,
                                        charge_id, action, request_id, key_id, detail,
                                        job_kind, job_key, job_payload, event_id, event_type,
                                        object, intent_id, ord)
        ), updated AS (
            -- The fences are not in `input`: a composite in a many-array `unnest` would be
            -- spread over columns of its own. Each row's is `$16[ord]`.
            UPDATE payments
               SET status = input.status,
                   amount_captured = input.amount_captured,
                   processor_payment_intent_id = input.intent_id,
                   processor_charge_id = coalesce(input.charge_id, processor_charge_id),
                   updated_at = now()
              FROM input
             WHERE payments.id = input.payment_id
               AND payments.xmin::text::bigint = input.version
            RETURNING payments.account_id, payments.id, input.ord
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT updated.account_id, updated.id, input.action, input.request_id, input.key_id,
                   input.detail
              FROM updated JOIN input USING (ord)
        ), job AS (
            INSERT INTO jobs (kind, dedupe_key, payload)
            SELECT input.job_kind, input.job_key, input.job_payload
              FROM updated JOIN input USING (ord)
             WHERE input.job_kind IS NOT NULL
            ON CONFLICT (kind, dedupe_key) DO NOTHING
        ), event AS (
            INSERT INTO events (id, account_id, type, object)
            SELECT input.event_id, updated.account_id, input.event_type, input.object
              FROM updated JOIN input USING (ord)
            RETURNING id, account_id, type
        ), deliveries AS (
            INSERT INTO jobs (kind, dedupe_key, payload)
            SELECT $17, d.dedupe_key, d.payload
              FROM event, webhook_deliveries(event.id, event.account_id, event.type) d
            ON CONFLICT (kind, dedupe_key) DO NOTHING
        )
        SELECT updated.ord AS "ord!", idem_commit_fence(($16::idem_fence[])[updated.ord]) AS "key_id!"
          FROM updated
        "#,
        &ids,
        &versions,
        &statuses,
        &captured,
        &charges as &[Option<String>],
        &actions,
        &requests,
        &key_ids,
        &details,
        &job_kinds as &[Option<String>],
        &job_keys as &[Option<String>],
        &payloads as &[Option<Value>],
        &event_ids,
        &event_types,
        &objects,
        &fences as &[idem::FenceRecord],
        JobKind::Webhook as JobKind,
        &intents,
    )
    .fetch_all(connection)
    .await?;
    let mut key_ids = vec![None; rows.len()];
    for row in written {
        let slot = usize::try_from(row.ord - 1)
            .ok()
            .and_then(|i| key_ids.get_mut(i))
            .ok_or(DomainError::Corrupt("a batch's row number"))?;
        *slot = Some(row.key_id);
    }
    Ok(key_ids)
}
