//! `POST /v1/payments/{id}/cancel`: `started` → `cancel_started` → finished.

use idem::{Interrupted, Lease, Operation, PhaseError, Step, boxed};
use provider::{CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, RefundRequest};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::authorization::{authorization, open_gate, reconcile_authorization, reopen};
use super::reconcile::{adopt_or_move_on, planned_call, refused_at_a_later_generation};
use super::{
    Context, LeaseInfo, PaymentOperation, current_payment, final_problem, payment_answer, record,
    unavailable,
};
use crate::DomainError;
use crate::events::{self, EventType};
use crate::payments::{self, Changes, PaymentStatus};

/// The stored name of a cancel.
pub const CANCEL_PAYMENT: &str = "payments.cancel";

recovery_points!(CancelPoint { Started => "started", CancelStarted => "cancel_started" });
/// Why a payment was canceled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancellationReason {
    /// A duplicate.
    Duplicate,
    /// Fraud.
    Fraudulent,
    /// The customer asked.
    RequestedByCustomer,
    /// Nobody completed it.
    Abandoned,
}

impl CancellationReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
            Self::Abandoned => "abandoned",
        }
    }
}

/// The stored input of a cancel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelParams {
    /// The account.
    pub account_id: String,
    /// The payment.
    pub payment_id: String,
    /// Why.
    pub cancellation_reason: Option<CancellationReason>,
}

/// The release of `charge_id`'s authorization, frozen under the payment's cancel key.
fn cancel_request(payment_id: &str, charge_id: &str) -> FrozenRequest {
    RefundRequest {
        charge_id: charge_id.to_owned(),
        payment_id: payment_id.to_owned(),
        refund_id: None,
        amount: None,
        reason: None,
    }
    .freeze(DownstreamKey::cancel(payment_id))
}

/// `POST /v1/payments/{id}/cancel`: releases the authorization at the processor.
#[derive(Debug)]
pub struct CancelPayment<P> {
    ctx: Context<P>,
    params: CancelParams,
}

impl<P: CardProcessor> CancelPayment<P> {
    /// The operation for validated input.
    pub fn new(ctx: Context<P>, params: CancelParams) -> Self {
        Self { ctx, params }
    }
}

impl<P: CardProcessor> PaymentOperation<P> for CancelPayment<P> {
    const NAME: &'static str = CANCEL_PAYMENT;
    type Params = CancelParams;

    fn with_params(ctx: &Context<P>, params: CancelParams) -> Self {
        Self::new(ctx.clone(), params)
    }

    fn params(&self) -> &CancelParams {
        &self.params
    }
}

impl<P: CardProcessor> Operation for CancelPayment<P> {
    type Point = CancelPoint;

    async fn step(&self, lease: &mut Lease, at: CancelPoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = self.ctx.public_base_url.clone();
        match at {
            CancelPoint::Started => {
                lease
                    .phase(|tx| {
                        let (params, info, base) =
                            (self.params.clone(), info.clone(), base.clone());
                        boxed(async move {
                            let gate = open_gate(
                                tx,
                                &params.account_id,
                                &params.payment_id,
                                None,
                                "canceled",
                                &info,
                            )
                            .await?;
                            Ok::<_, PhaseError<DomainError>>(gate.into_step(
                                CancelPoint::CancelStarted,
                                cancel_request,
                                &info,
                                &base,
                            ))
                        })
                    })
                    .await?;
            }
            CancelPoint::CancelStarted => {
                let payment = current_payment(
                    &self.ctx.pool,
                    &self.params.account_id,
                    &self.params.payment_id,
                )
                .await?;
                let charge_id = authorization(&payment)?.to_owned();
                let request =
                    planned_call(lease, at, || cancel_request(&payment.id, &charge_id)).await?;
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.before_call")).await;
                let outcome = self.ctx.processor.create_refund(&request).await.map(|_| ());
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let found = reconcile_authorization(
                            &self.ctx,
                            lease,
                            &charge_id,
                            "cancel",
                            |charge| !charge.captured && charge.amount_refunded >= charge.amount,
                            |charge| charge.paid && !charge.captured && charge.amount_refunded == 0,
                        )
                        .await?;
                        let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
                        match adopt_or_move_on(lease, at, &request, object, "cancel", &err, found)
                            .await?
                        {
                            Some((_charge, detail)) => (Ok(()), Some(detail)),
                            None => return Ok(()),
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                let problem = match &outcome {
                    Ok(()) => None,
                    Err(err) => {
                        Some(final_problem(err, &payment.id).ok_or_else(|| unavailable(err))?)
                    }
                };
                let reason = self.params.cancellation_reason.map(CancellationReason::as_str);
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
