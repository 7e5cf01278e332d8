//! `POST /v1/payments/{id}/capture`: `started` → `capture_started` → finished.

use idem::{Interrupted, Lease, Operation, PhaseError, Step, boxed};
use provider::{CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, ProcessorError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::authorization::{authorization, open_gate, reconcile_authorization, reopen};
use super::reconcile::{adopt_or_move_on, planned_call, refused_at_a_later_generation};
use super::{
    Context, LeaseInfo, PaymentOperation, current_payment, final_problem, payment_answer, record,
    unavailable,
};
use crate::DomainError;
use crate::audit;
use crate::events::{self, EventType};
use crate::payments::{self, Changes, PaymentStatus};
use crate::problems::{Problem, ProblemCode};

/// The stored name of a capture.
pub const CAPTURE_PAYMENT: &str = "payments.capture";

recovery_points!(CapturePoint { Started => "started", CaptureStarted => "capture_started" });
/// The stored input of a capture.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureParams {
    /// The account.
    pub account_id: String,
    /// The payment.
    pub payment_id: String,
    /// Default: the whole authorized amount.
    pub amount_to_capture: Option<i64>,
}

/// The capture of `charge_id`, frozen under the payment's capture key.
fn capture_request(payment_id: &str, charge_id: &str, amount: Option<i64>) -> FrozenRequest {
    FrozenRequest::capture(charge_id, amount, DownstreamKey::capture(payment_id))
}

/// `POST /v1/payments/{id}/capture`.
#[derive(Debug)]
pub struct CapturePayment<P> {
    ctx: Context<P>,
    params: CaptureParams,
}

impl<P: CardProcessor> CapturePayment<P> {
    /// The operation for validated input.
    pub fn new(ctx: Context<P>, params: CaptureParams) -> Self {
        Self { ctx, params }
    }
}

impl<P: CardProcessor> PaymentOperation<P> for CapturePayment<P> {
    const NAME: &'static str = CAPTURE_PAYMENT;
    type Params = CaptureParams;

    fn with_params(ctx: &Context<P>, params: CaptureParams) -> Self {
        Self::new(ctx.clone(), params)
    }

    fn params(&self) -> &CaptureParams {
        &self.params
    }
}

impl<P: CardProcessor> Operation for CapturePayment<P> {
    type Point = CapturePoint;

    async fn step(&self, lease: &mut Lease, at: CapturePoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = self.ctx.public_base_url.clone();
        match at {
            CapturePoint::Started => {
                lease
                    .phase(|tx| {
                        let (params, info, base) =
                            (self.params.clone(), info.clone(), base.clone());
                        boxed(async move {
                            let gate = open_gate(
                                tx,
                                &params.account_id,
                                &params.payment_id,
                                params.amount_to_capture,
                                "captured",
                                &info,
                            )
                            .await?;
                            let plan = |payment: &str, charge: &str| {
                                capture_request(payment, charge, params.amount_to_capture)
                            };
                            Ok::<_, PhaseError<DomainError>>(gate.into_step(
                                CapturePoint::CaptureStarted,
                                plan,
                                &info,
                                &base,
                            ))
                        })
                    })
                    .await?;
            }
            CapturePoint::CaptureStarted => {
                let payment = current_payment(
                    &self.ctx.pool,
                    &self.params.account_id,
                    &self.params.payment_id,
                )
                .await?;
                let charge_id = authorization(&payment)?.to_owned();
                let amount = self.params.amount_to_capture;
                let request =
                    planned_call(lease, at, || capture_request(&payment.id, &charge_id, amount))
                        .await?;
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
                        let found = reconcile_authorization(
                            &self.ctx,
                            lease,
                            &charge_id,
                            "capture",
                            |charge| charge.captured,
                            |charge| charge.paid && !charge.captured && charge.amount_refunded == 0,
                        )
                        .await?;
                        let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
                        match adopt_or_move_on(lease, at, &request, object, "capture", &err, found)
                            .await?
                        {
                            Some((charge, detail)) => (Ok(charge), Some(detail)),
                            None => return Ok(()),
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                let problem = match &outcome {
                    Ok(_) => None,
                    Err(err) => {
                        Some(final_problem(err, &payment.id).ok_or_else(|| unavailable(err))?)
                    }
                };
                let key = request.key.clone();
                lease
                    .phase(|tx| {
                        let (payment, info, base, problem, key, reconciled) = (payment.clone(), info.clone(), base.clone(), problem.clone(), key.clone(), reconciled.clone());
                        let captured = outcome.as_ref().ok().map(|c| c.amount_captured);
                        boxed(async move {
                            if let Some(detail) = reconciled {
                                record(tx, &payment.account_id, &payment.id, "payment.reconciled", &info, detail).await?;
                            }
                            let step = match (captured, problem) {
                                (Some(amount_captured), _) => {
                                    let changes = Changes { status: Some(PaymentStatus::Succeeded), amount_captured: Some(amount_captured), ..Changes::default() };
                                    let payment = payments::update(tx, &payment.id, &changes, None).await?;
                                    if let Some(email) = &payment.receipt_email {
                                        audit::stage_job(tx, "receipt", &payment.id, json!({"payment_id": payment.id, "email": email})).await?;
                                    }
                                    record(tx, &payment.account_id, &payment.id, "payment.captured", &info, json!({"amount_captured": amount_captured, "downstream_key": key.as_str()})).await?;
                                    events::record(tx, &payment.account_id, EventType::PaymentCaptured, &payment.to_json()).await?;
                                    Step::<CapturePoint>::Finish(payment_answer(200, &payment, false))
                                }
                                (None, problem) => {
                                    let problem = problem.unwrap_or_else(|| Problem::new(ProblemCode::InvalidRequest, "The card processor refused the capture."));
                                    Step::Finish(reopen(tx, &payment, &info, &problem, &base, "payment.capture_refused").await?)
                                }
                            };
                            Ok::<_, PhaseError<DomainError>>(step)
                        })
                    })
                    .await?;
            }
        }
        Ok(())
    }
}
