//! The last phase of a new payment, in each of its three outcomes, over the phase's fenced
//! transaction: authorized ([`charged`]), refused ([`failed`]), or waiting on its customer
//! ([`awaiting`]). Each writes the payment, its audit record and its event (with the event's
//! webhook deliveries), and answers the stored answer.

use idem::{Interrupted, StoredResponse};
use provider::{DownstreamKey, IntentStatus, PaymentIntent, ProcessorError};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::super::reconcile::audit_other_charge;
use super::super::{
    Learnt, LeaseInfo, Refused, failure_code, final_problem, payment_answer, problem_answer,
    record_reconciled, unavailable,
};
use crate::DomainError;
use crate::audit::{self, AuditEvent};
use crate::authentication::{self, AuthenticationSettings, REQUIRES_ACTION};
use crate::events::{self, EventType};
use crate::jobs::{self, Work};
use crate::payments::{self, Changes, Payment, PaymentStatus};
use crate::processor_events::ExtraCharge;

/// A PaymentIntent the processor did not authorize as the refusal stored for it: adopted from a
/// declined one (the call's own answer, its webhook, or the search), the answer the 402 would
/// have been. A failure that is not final interrupts the step.
pub(super) fn refusal_of(
    declined: Result<PaymentIntent, ProcessorError>,
    payment: &Payment,
) -> Result<Refused, Interrupted> {
    let err = match declined {
        Ok(intent) => ProcessorError::Declined {
            decline_code: intent.decline_code(),
            message: intent.failure_message().unwrap_or("Your card was declined.").to_owned(),
            charge_id: intent.latest_charge.clone(),
            payment_intent: Some(intent.id),
        },
        Err(err) => err,
    };
    let problem = final_problem(&err, &payment.id).ok_or_else(|| unavailable(&err))?;
    Ok(Refused { err, problem })
}

/// The last phase when the processor authorized the payment: the payment `succeeded` (or
/// `requires_capture` for a manual capture), its receipt staged, its event recorded. Answers the
/// stored answer, and another success for the payment if one was found (and audited).
pub(super) async fn charged(
    tx: &mut PgConnection,
    payment: &Payment,
    intent: &PaymentIntent,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
) -> Result<(StoredResponse, Option<ExtraCharge>), DomainError> {
    record_reconciled(tx, payment.reconciled(), info, learnt.reconciled).await?;
    let recorded = Recorded::of(payment, intent, learnt.key);
    let audit = recorded.audit(payment, info);
    let payment = payments::update(tx, &payment.id, &recorded.changes, Some(&audit)).await?;
    let extra = audit_other_charge(tx, &payment, learnt.key, info).await?;
    if let Some(receipt) = Recorded::receipt(&payment) {
        audit::stage_job(tx, &receipt).await?;
    }
    events::record(tx, &payment.account_id, recorded.event, &payment.to_json()).await?;
    Ok((payment_answer(201, &payment, true), extra))
}

/// What recording an authorized PaymentIntent does to a payment, in either form of the phase.
pub(super) struct Recorded<'a> {
    pub(super) changes: Changes<'a>,
    /// The audit record's detail.
    detail: Value,
    pub(super) event: EventType,
}

impl<'a> Recorded<'a> {
    pub(super) fn of(payment: &Payment, intent: &'a PaymentIntent, key: &DownstreamKey) -> Self {
        let (status, captured) = match intent.status {
            // A compatible server may leave `amount_received` out: a PaymentIntent that
            // succeeded captured its amount.
            IntentStatus::Succeeded => {
                let received = intent.amount_received.unwrap_or(intent.amount);
                (PaymentStatus::Succeeded, received.min(payment.amount.get()))
            }
            _ => (PaymentStatus::RequiresCapture, 0),
        };
        let changes = Changes {
            status: Some(status),
            amount_captured: Some(captured),
            processor_payment_intent_id: Some(&intent.id),
            processor_charge_id: intent.latest_charge.as_deref(),
            ..Changes::default()
        };
        let detail = json!({"payment_intent": intent.id, "charge": intent.latest_charge,
                            "downstream_key": key.as_str(), "status": status});
        let event = match status {
            PaymentStatus::Succeeded => EventType::PaymentSucceeded,
            _ => EventType::PaymentRequiresCapture,
        };
        Self { changes, detail, event }
    }

    pub(super) fn audit<'p>(&self, payment: &'p Payment, info: &'p LeaseInfo) -> AuditEvent<'p> {
        info.audit(&payment.account_id, &payment.id, "payment.charged", self.detail.clone())
    }

    /// The receipt of the payment as recorded, when it succeeded and has an address.
    pub(super) fn receipt(recorded: &Payment) -> Option<Work> {
        Work::receipt(recorded).filter(|_| recorded.status == PaymentStatus::Succeeded)
    }
}

/// The last phase when the processor refused the payment for good: the payment `failed`, with
/// the processor's code and the problem's detail, its event recorded, and the problem stored as
/// the answer. Answers it, and a success for the payment after all if one was found.
pub(super) async fn failed(
    tx: &mut PgConnection,
    payment: &Payment,
    refused: &Refused,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
    base: &str,
) -> Result<(StoredResponse, Option<ExtraCharge>), DomainError> {
    record_reconciled(tx, payment.reconciled(), info, learnt.reconciled).await?;
    let Refused { err, problem } = refused;
    let (charge_id, intent_id) = match err {
        ProcessorError::Declined { charge_id, payment_intent, .. } => {
            (charge_id.as_deref(), payment_intent.as_deref())
        }
        _ => (None, None),
    };
    let code = failure_code(err);
    let changes = Changes {
        status: Some(PaymentStatus::Failed),
        processor_payment_intent_id: intent_id,
        processor_charge_id: charge_id,
        failure_code: Some(&code),
        failure_message: Some(&problem.detail),
        ..Changes::default()
    };
    let detail = json!({"error": err.to_string()});
    let audit = info.audit(&payment.account_id, &payment.id, "payment.failed", detail);
    let payment = payments::update(tx, &payment.id, &changes, Some(&audit)).await?;
    let extra = audit_other_charge(tx, &payment, learnt.key, info).await?;
    events::record(tx, &payment.account_id, EventType::PaymentFailed, &payment.to_json()).await?;
    Ok((problem_answer(problem, &info.request_id, base), extra))
}

/// The last phase when the customer must authenticate: the payment `requires_action`, with the
/// PaymentIntent and where to send the customer, its event recorded, and the authentication job
/// staged (`crate::authentication`: the worker asks the processor if no webhook tells us first,
/// and cancels once the authentication expires). The key is finished with this answer: a retry
/// replays it, and the outcome arrives later, by the webhook or the job.
pub(super) async fn awaiting(
    tx: &mut PgConnection,
    payment: &Payment,
    intent: &PaymentIntent,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
    settings: &AuthenticationSettings,
) -> Result<StoredResponse, Interrupted> {
    let Some(url) = intent.action_url() else {
        // We sent a `return_url`, so a card's authentication is a redirect.
        return Err(Interrupted::NeedsHuman {
            reason: format!("{} requires an action that is not a redirect", intent.id),
        });
    };
    record_reconciled(tx, payment.reconciled(), info, learnt.reconciled).await?;
    let changes = Changes {
        status: Some(PaymentStatus::RequiresAction),
        processor_payment_intent_id: Some(&intent.id),
        next_action_url: Some(Some(url)),
        ..Changes::default()
    };
    let detail = json!({"payment_intent": intent.id, "downstream_key": learnt.key.as_str()});
    let audit = info.audit(&payment.account_id, &payment.id, REQUIRES_ACTION, detail);
    let payment = payments::update(tx, &payment.id, &changes, Some(&audit)).await?;
    let now = authentication::database_now(tx).await?;
    jobs::stage_after(tx, &settings.job(&payment, now), settings.check_after).await?;
    let event = EventType::PaymentRequiresAction;
    events::record(tx, &payment.account_id, event, &payment.to_json()).await?;
    Ok(payment_answer(201, &payment, true))
}
