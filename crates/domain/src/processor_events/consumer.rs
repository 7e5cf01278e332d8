//! The idempotent consumer of a verified event ([`receive`]): the event id and its effect
//! recorded in one transaction that holds the payment's row, and what that did ([`Received`]).

use sqlx::{PgConnection, PgPool};

use super::extra_charge::{ExtraCharge, audit_extra_charge, report_extra_charge};
use super::{ProcessorEvent, ProcessorEventType, Reported};
use crate::DomainError;
use crate::authentication::{self, Settled, SettledBy};
use crate::ids::PaymentId;
use crate::jobs::{self, JobKind};
use crate::payments::{self, ChargeRecord, PaymentStatus};

/// What receiving an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Recorded against one of our payments; `woke` if the key creating it was unfinished and is
    /// now due for the completer.
    Recorded {
        /// The payment.
        payment_id: PaymentId,
        /// Whether the creating key was brought forward.
        woke: bool,
    },
    /// Recorded against one of our payments, which has another charge recorded, or was recorded
    /// `failed` without one: the processor charged the card once more than the payment says (an
    /// earlier generation of the downstream key made a charge that the lookups missed, or the
    /// processor charged despite the refusal it answered). Audited as `payment.extra_charge` for
    /// a person; nothing is refunded automatically.
    ExtraCharge {
        /// The payment.
        payment_id: PaymentId,
        /// The charge the event reports, which the payment does not account for.
        extra: ExtraCharge,
    },
    /// Recorded, with the outcome it reports of a payment that waited on its customer
    /// (`crate::authentication::settle`): the payment's new status.
    Settled {
        /// The payment.
        payment_id: PaymentId,
        /// What it is now.
        status: PaymentStatus,
    },
    /// Recorded, about an object that is none of our payments': nothing else to do.
    Unmatched,
    /// This event id was received before: nothing changed.
    Duplicate,
}

/// The idempotent consumer: records the event and its effect in one transaction, or finds it
/// recorded and changes nothing.
pub async fn receive(pool: &PgPool, event: &ProcessorEvent) -> Result<Received, DomainError> {
    let mut tx = pool.begin().await?;
    // An id that is not one of ours in shape names none of our payments.
    let payment_id = event.reported.payment_id().and_then(|id| PaymentId::parse(id).ok());
    let payment = match &payment_id {
        Some(id) => payments::lock_for_news(&mut tx, id).await?,
        None => None,
    };
    let known = payment.is_some().then_some(payment_id).flatten();
    // Two deliveries of one event at once: the second waits on the first's row, then inserts
    // nothing.
    let inserted = sqlx::query!(
        r#"INSERT INTO processor_events
               (id, type, object_id, payment_id, downstream_key, object, created)
           VALUES ($1, $2, $3, $4, $5, $6, $7)
           ON CONFLICT (id) DO NOTHING"#,
        event.id,
        event.event_type as ProcessorEventType,
        event.reported.id(),
        known.as_ref() as Option<&PaymentId>,
        event.downstream_key,
        event.object,
        event.created,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(Received::Duplicate);
    }
    let received = match (known, payment) {
        (Some(payment_id), Some(payment)) => {
            match settled_by(&mut tx, &payment_id, &payment, event).await? {
                Settled::Recorded(status, None) => Received::Settled { payment_id, status },
                Settled::Recorded(_, Some(extra)) => Received::ExtraCharge { payment_id, extra },
                Settled::NotYet => Received::Recorded { payment_id, woke: false },
                Settled::NotWaiting => news(&mut tx, payment_id, &payment, event).await?,
            }
        }
        _ => Received::Unmatched,
    };
    // A crash here loses the record and its effect together: the processor delivers again (it
    // got no 2xx), and a payment waiting on its customer is also asked after by its job.
    idem::failpoint(|| "processor_events.receive.before_commit".to_owned()).await;
    tx.commit().await?;
    if let Received::ExtraCharge { payment_id, extra } = &received {
        report_extra_charge(payment_id, extra, "webhook");
    }
    Ok(received)
}

/// What the PaymentIntent `event` reports settles `payment`, if the payment waits on its
/// customer, or awaits a capture that the processor's cancel made impossible
/// (`crate::authentication::settle`). A payment settled `failed` has its authentication job
/// brought forward: the job closes the PaymentIntent that the failed attempt left open.
async fn settled_by(
    tx: &mut PgConnection,
    payment_id: &PaymentId,
    payment: &ChargeRecord,
    event: &ProcessorEvent,
) -> Result<Settled, DomainError> {
    let Reported::Intent(intent) = &event.reported else { return Ok(Settled::NotWaiting) };
    if !matches!(payment.status, PaymentStatus::RequiresAction | PaymentStatus::RequiresCapture) {
        return Ok(Settled::NotWaiting);
    }
    let settled =
        authentication::settle(tx, payment_id, intent, SettledBy::Webhook(&event.id)).await?;
    if let Settled::Recorded(PaymentStatus::Failed, _) = settled {
        // An authentication job is staged under its payment's id.
        jobs::bring_forward(tx, JobKind::Authentication, payment_id.as_str()).await?;
    }
    Ok(settled)
}

/// News that settles nothing: a success the payment does not account for is audited for a
/// person; any other news wakes the payment's creating key, which does nothing once the key is
/// finished (a payment that records a charge or its outcome).
async fn news(
    tx: &mut PgConnection,
    payment_id: PaymentId,
    payment: &ChargeRecord,
    event: &ProcessorEvent,
) -> Result<Received, DomainError> {
    if let Some(extra) = unaccounted(payment, event) {
        let (account, key_id) = (&payment.account_id, payment.key_id);
        let found_by = ("webhook", &*event.id);
        audit_extra_charge(tx, &payment_id, account, key_id, &extra, found_by).await?;
        return Ok(Received::ExtraCharge { payment_id, extra });
    }
    let woke = match payment.key_id {
        Some(key_id) => {
            event.event_type.may_answer_the_create() && idem::wake(&mut *tx, key_id).await?
        }
        None => false,
    };
    Ok(Received::Recorded { payment_id, woke })
}

/// The charge or PaymentIntent `event` reports as a success, if `payment` does not account for
/// it: the payment records another one, or records this one as declined (`failed`), or its
/// outcome is recorded (it is no longer `processing` nor waiting on its customer) without any,
/// so no phase will ever adopt this one (the key is finished: a refusal was recorded).
fn unaccounted(payment: &ChargeRecord, event: &ProcessorEvent) -> Option<ExtraCharge> {
    let recorded = match event.event_type {
        ProcessorEventType::ChargeSucceeded => &payment.charge_id,
        ProcessorEventType::IntentSucceeded | ProcessorEventType::IntentAmountCapturableUpdated => {
            &payment.intent_id
        }
        _ => return None,
    };
    let reported = event.reported.id();
    // A charge made under the PaymentIntent the payment records is that PaymentIntent's, whether
    // or not the payment knows its id (a compatible server may leave `latest_charge` out).
    let under_recorded_intent = matches!(&event.reported, Reported::Charge(charge)
        if charge.payment_intent.is_some() && charge.payment_intent == payment.intent_id);
    let accounted = match recorded {
        _ if under_recorded_intent => payment.status != PaymentStatus::Failed,
        Some(recorded) => recorded == reported && payment.status != PaymentStatus::Failed,
        None => matches!(payment.status, PaymentStatus::Processing | PaymentStatus::RequiresAction),
    };
    (!accounted).then(|| ExtraCharge {
        charge_id: reported.to_owned(),
        downstream_key: event.downstream_key.clone(),
        recorded: payment.charge_id.clone(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::ids::AccountId;

    fn succeeded(charge_id: &str) -> ProcessorEvent {
        let object = json!({"id": charge_id, "amount": 500, "currency": "usd", "captured": true,
            "paid": true, "status": "succeeded", "amount_captured": 500, "amount_refunded": 0,
            "refunded": false});
        ProcessorEvent {
            id: "evt_1".into(),
            event_type: ProcessorEventType::ChargeSucceeded,
            created: 0,
            reported: Reported::Charge(serde_json::from_value(object.clone()).unwrap()),
            object,
            downstream_key: Some("pay_1/charge".into()),
        }
    }

    fn payment(charge_id: Option<&str>, status: PaymentStatus) -> ChargeRecord {
        let account_id = AccountId::parse("acct_1").unwrap();
        let charge_id = charge_id.map(Into::into);
        ChargeRecord { account_id, key_id: Some(1), charge_id, intent_id: None, status }
    }

    #[test]
    fn a_success_of_the_charge_a_payment_records_as_declined_is_for_a_person() {
        let event = succeeded("ch_1");
        assert_eq!(unaccounted(&payment(Some("ch_1"), PaymentStatus::Succeeded), &event), None);
        assert_eq!(unaccounted(&payment(None, PaymentStatus::Processing), &event), None);
        let extra = |recorded: Option<&str>| ExtraCharge {
            charge_id: "ch_1".into(),
            downstream_key: Some("pay_1/charge".into()),
            recorded: recorded.map(Into::into),
        };
        let declined = payment(Some("ch_1"), PaymentStatus::Failed);
        assert_eq!(unaccounted(&declined, &event), Some(extra(Some("ch_1"))));
        let another = payment(Some("ch_0"), PaymentStatus::Succeeded);
        assert_eq!(unaccounted(&another, &event), Some(extra(Some("ch_0"))));
        let refused = payment(None, PaymentStatus::Failed);
        assert_eq!(unaccounted(&refused, &event), Some(extra(None)));
        // A payment that waits on its customer records its charge once the outcome comes.
        assert_eq!(unaccounted(&payment(None, PaymentStatus::RequiresAction), &event), None);
    }
}
