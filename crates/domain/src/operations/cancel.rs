//! `POST /v1/payments/{id}/cancel`: `started` → `cancel_started` → finished.

use idem::{Interrupted, Lease, Operation, PhaseError, Step, boxed};
use provider::{CardProcessor, Charge, DownstreamKey, ErrorClass, FrozenRequest, RefundRequest};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::authorization::{
    PlanCall, authorized_payment, open_phase, reconcile_authorization, reopen,
};
use super::reconcile::{planned_call, refused_at_a_later_generation};
use super::{LeaseInfo, payment_answer, record, refusal};
use crate::DomainError;
use crate::events::{self, EventType};
use crate::ids::{AccountId, PaymentId};
use crate::money::Amount;
pub use crate::payments::CancellationReason;
use crate::payments::{self, Changes, PaymentStatus};

/// The stored name of a cancel.
pub const CANCEL_PAYMENT: &str = "payments.cancel";

recovery_points!(CancelPoint { Started => "started", CancelStarted => "cancel_started" });

/// The stored input of a cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelParams {
    /// The account.
    pub account_id: AccountId,
    /// The payment.
    pub payment_id: PaymentId,
    /// Why.
    pub cancellation_reason: Option<CancellationReason>,
}

/// The release of `charge_id`'s authorization, frozen under the payment's cancel key (a cancel
/// has no amount: it releases the whole authorization).
fn cancel_request(payment_id: &str, charge_id: &str, _amount: Option<Amount>) -> FrozenRequest {
    RefundRequest {
        charge_id: charge_id.to_owned(),
        payment_id: payment_id.to_owned(),
        refund_id: None,
        amount: None,
        reason: None,
    }
    .freeze(DownstreamKey::cancel(payment_id))
}

payment_operation! {
    /// `POST /v1/payments/{id}/cancel`: releases the authorization at the processor.
    CancelPayment(CancelParams) = CANCEL_PAYMENT
}

impl<P: CardProcessor> Operation for CancelPayment<P> {
    type Point = CancelPoint;

    async fn step(&self, lease: &mut Lease, at: CancelPoint) -> Result<(), Interrupted> {
        match at {
            CancelPoint::Started => {
                let payment = (&self.params.account_id, &self.params.payment_id);
                let next = (CancelPoint::CancelStarted, cancel_request as PlanCall);
                open_phase(lease, payment, None, "canceled", next, &self.ctx.public_base_url)
                    .await?;
            }
            CancelPoint::CancelStarted => {
                let (info, base) = (LeaseInfo::of(lease), self.ctx.public_base_url.clone());
                let (account_id, payment_id) = (&self.params.account_id, &self.params.payment_id);
                let (payment, charge_id) =
                    authorized_payment(&self.ctx, account_id, payment_id).await?;
                let request =
                    planned_call(lease, at, || cancel_request(&payment.id, &charge_id, None))
                        .await?;
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.before_call")).await;
                let outcome = self.ctx.processor.create_refund(&request).await.map(|_| ());
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let call = (at, &request);
                        let (ctx, of) = (&self.ctx, (&payment, charge_id.as_str()));
                        let done = |charge: &Charge| {
                            !charge.captured && charge.amount_refunded >= charge.amount
                        };
                        match reconcile_authorization(ctx, lease, call, of, "cancel", &err, done)
                            .await?
                        {
                            Some((_charge, detail)) => (Ok(()), Some(detail)),
                            None => return Ok(()),
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                let problem = refusal(&outcome, &payment.id)?;
                let reason = self.params.cancellation_reason;
                let key = request.key.clone();
                lease
                    .phase(|tx| {
                        let (payment, info, base, problem, key, reconciled) = (
                            payment.clone(),
                            info.clone(),
                            base.clone(),
                            problem.clone(),
                            key.clone(),
                            reconciled.clone(),
                        );
                        boxed(async move {
                            if let Some(detail) = reconciled {
                                record(
                                    tx,
                                    &payment.account_id,
                                    &payment.id,
                                    "payment.reconciled",
                                    &info,
                                    detail,
                                )
                                .await?;
                            }
                            let step = match problem {
                                None => {
                                    let changes = Changes {
                                        status: Some(PaymentStatus::Canceled),
                                        cancellation_reason: reason,
                                        ..Changes::default()
                                    };
                                    let payment =
                                        payments::update(tx, &payment.id, &changes, None).await?;
                                    record(
                                        tx,
                                        &payment.account_id,
                                        &payment.id,
                                        "payment.canceled",
                                        &info,
                                        json!({"downstream_key": key.as_str()}),
                                    )
                                    .await?;
                                    events::record(
                                        tx,
                                        &payment.account_id,
                                        EventType::PaymentCanceled,
                                        &payment.to_json(),
                                    )
                                    .await?;
                                    Step::<CancelPoint>::Finish(payment_answer(
                                        200, &payment, false,
                                    ))
                                }
                                Some(problem) => Step::Finish(
                                    reopen(
                                        tx,
                                        &payment,
                                        &info,
                                        &problem,
                                        &base,
                                        "payment.cancel_refused",
                                    )
                                    .await?,
                                ),
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
