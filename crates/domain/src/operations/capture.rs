//! `POST /v1/payments/{id}/capture`: `started` → `capture_started` → finished.

use idem::{Interrupted, Lease, Operation, Phase, PhaseError, Step};
use provider::{CardProcessor, Charge, DownstreamKey, ErrorClass, FrozenRequest, ProcessorError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::authorization::{
    PlanCall, authorized_payment, open_phase, reconcile_authorization, reopen,
};
use super::reconcile::{planned_call, refused_at_a_later_generation};
use super::{LeaseInfo, payment_answer, record, record_reconciled, refusal};
use crate::DomainError;
use crate::audit;
use crate::events::{self, EventType};
use crate::ids::{AccountId, PaymentId};
use crate::jobs::Work;
use crate::money::Amount;
use crate::payments::{self, Changes, Payment, PaymentStatus};
use crate::problems::{Problem, ProblemCode};

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
                let amount = self.params.amount_to_capture;
                // No plan stored: a release that did not freeze its calls moved the key here, and
                // its call went out under the payment's one capture key.
                let legacy = || {
                    let key = DownstreamKey::per_payment(&payment.id, "capture");
                    FrozenRequest::capture(&charge_id, amount.map(Amount::get), key)
                };
                let request = planned_call(lease, at, legacy).await?;
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
                let problem = refusal(&outcome, &payment.id)?;
                let captured = outcome.as_ref().ok().map(|charge| charge.amount_captured);
                let reconciled = reconciled.as_ref();
                let (key, problem) = (&request.key, problem.as_ref());
                let finish = Captured {
                    payment: &payment,
                    captured,
                    problem,
                    key,
                    reconciled,
                    info: &info,
                    base,
                };
                lease.phase(finish).await?;
            }
        }
        Ok(())
    }
}

/// The last phase: the payment `succeeded` with the amount the processor captured, its receipt
/// staged; or, refused, the payment awaits capture again and the refusal is the answer.
struct Captured<'a> {
    payment: &'a Payment,
    /// The amount captured, or `None` when the processor refused.
    captured: Option<i64>,
    /// The processor's refusal as a problem, if it gave one.
    problem: Option<&'a Problem>,
    key: &'a DownstreamKey,
    /// What reconciliation found, when it answered for the call.
    reconciled: Option<&'a Value>,
    info: &'a LeaseInfo,
    base: &'a str,
}

impl Phase for Captured<'_> {
    type Point = CapturePoint;
    type Error = DomainError;

    async fn run(
        &mut self,
        tx: &mut PgConnection,
    ) -> Result<Step<CapturePoint>, PhaseError<DomainError>> {
        let (payment, info) = (self.payment, self.info);
        let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
        record_reconciled(tx, object, info, self.reconciled).await?;
        let Some(amount_captured) = self.captured else {
            let problem = self.problem.cloned().unwrap_or_else(|| {
                Problem::new(ProblemCode::InvalidRequest, "The card processor refused the capture.")
            });
            let what = "payment.capture_refused";
            return Ok(Step::Finish(reopen(tx, payment, info, &problem, self.base, what).await?));
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
        let detail =
            json!({"amount_captured": amount_captured, "downstream_key": self.key.as_str()});
        record(tx, &payment.account_id, &payment.id, "payment.captured", info, detail).await?;
        events::record(tx, &payment.account_id, EventType::PaymentCaptured, &payment.to_json())
            .await?;
        Ok(Step::Finish(payment_answer(200, &payment, false)))
    }
}
