//! `POST /v1/payments/{id}/capture`: `started` → `capture_started` → finished.

use idem::{Interrupted, Lease, Operation, StoredResponse};
use provider::{CardProcessor, Charge, DownstreamKey, ErrorClass, FrozenRequest, ProcessorError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;

use super::authorization::{
    PlanCall, authorized_payment, open_phase, reconcile_authorization, reopen,
};
use super::reconcile::{planned_call, refused_at_a_later_generation};
use super::{Learnt, LeaseInfo, Refused, final_outcome, payment_answer, record, record_reconciled};
use crate::DomainError;
use crate::audit;
use crate::events::{self, EventType};
use crate::ids::{AccountId, PaymentId};
use crate::jobs::Work;
use crate::money::Amount;
use crate::payments::{self, Changes, Payment, PaymentStatus};

/// The stored name of a capture.
pub const CAPTURE_PAYMENT: &str = "payments.capture";

recovery_points!(CapturePoint { Started => "started", CaptureStarted => "capture_started" });

/// The stored input of a capture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureParams {
    /// The account.
    pub account_id: AccountId,
    /// The payment.
    pub payment_id: PaymentId,
    /// Default: the whole authorized amount.
    pub amount_to_capture: Option<Amount>,
}

/// The capture of `charge_id`, frozen under this capture's own key.
fn capture_request(
    payment_id: &str,
    charge_id: &str,
    amount: Option<Amount>,
    key_id: i64,
) -> FrozenRequest {
    let key = DownstreamKey::capture(payment_id, key_id);
    FrozenRequest::capture(charge_id, amount.map(Amount::get), key)
}

payment_operation! {
    /// `POST /v1/payments/{id}/capture`.
    CapturePayment(CaptureParams) = CAPTURE_PAYMENT
}

impl<P: CardProcessor> Operation for CapturePayment<P> {
    type Point = CapturePoint;

    async fn step(&mut self, lease: &mut Lease, at: CapturePoint) -> Result<(), Interrupted> {
        match at {
            CapturePoint::Started => {
                let payment = (&self.params.account_id, &self.params.payment_id);
                let amount = self.params.amount_to_capture;
                let next = (CapturePoint::CaptureStarted, capture_request as PlanCall);
                open_phase(lease, payment, amount, "captured", next, &self.ctx.public_base_url)
                    .await?;
            }
            CapturePoint::CaptureStarted => {
                let (info, base) = (LeaseInfo::of(lease), &self.ctx.public_base_url);
                let (account_id, payment_id) = (&self.params.account_id, &self.params.payment_id);
                let (payment, charge_id) =
                    authorized_payment(&self.ctx, account_id, payment_id).await?;
                let request = planned_call(lease).await?;
                idem::failpoint(|| format!("{CAPTURE_PAYMENT}.before_call")).await;
                let outcome = match self.ctx.processor.capture_charge(&request).await {
                    // A capture that answers with an uncaptured charge did not say what it did.
                    Ok(charge) if !charge.captured => Err(ProcessorError::UnknownOutcome {
                        message: format!("the capture answered with {} uncaptured", charge.id),
                    }),
                    other => other,
                };
                idem::failpoint(|| format!("{CAPTURE_PAYMENT}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let call = (at, &request);
                        let (ctx, of) = (&self.ctx, (&payment, charge_id.as_str()));
                        let done = |charge: &Charge| charge.captured;
                        match reconcile_authorization(ctx, lease, call, of, "capture", &err, done)
                            .await?
                        {
                            Some((charge, detail)) => (Ok(charge), Some(detail)),
                            None => return Ok(()),
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                let outcome =
                    final_outcome(outcome.map(|charge| charge.amount_captured), &payment.id)?;
                let learnt = Learnt { key: &request.key, reconciled: reconciled.as_ref() };
                let mut tx = lease.begin().await?;
                let answer = captured(&mut tx, &payment, outcome, learnt, &info, base).await?;
                tx.commit_answer(answer).await?;
            }
        }
        Ok(())
    }
}

/// The last phase: the payment `succeeded` with the amount the processor captured, its receipt
/// staged; or, refused, the payment awaits capture again and the refusal is the answer.
async fn captured(
    tx: &mut PgConnection,
    payment: &Payment,
    outcome: Result<i64, Refused>,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
    base: &str,
) -> Result<StoredResponse, DomainError> {
    let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
    record_reconciled(tx, object, info, learnt.reconciled).await?;
    let amount_captured = match outcome {
        Ok(amount_captured) => amount_captured,
        Err(refused) => {
            let what = "payment.capture_refused";
            return reopen(tx, payment, info, &refused.problem, base, what).await;
        }
    };
    let changes = Changes {
        status: Some(PaymentStatus::Succeeded),
        amount_captured: Some(amount_captured),
        ..Changes::default()
    };
    let payment = payments::update(tx, &payment.id, &changes, None).await?;
    if let Some(receipt) = Work::receipt(&payment) {
        audit::stage_job(tx, &receipt).await?;
    }
    let detail = json!({"amount_captured": amount_captured, "downstream_key": learnt.key.as_str()});
    record(tx, &payment.account_id, &payment.id, "payment.captured", info, detail).await?;
    events::record(tx, &payment.account_id, EventType::PaymentCaptured, &payment.to_json()).await?;
    Ok(payment_answer(200, &payment, false))
}
