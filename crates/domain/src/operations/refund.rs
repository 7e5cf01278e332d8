//! `POST /v1/payments/{id}/refunds`: `started` → `refund_created` → finished. The first phase
//! locks the payment and reserves the amount, so concurrent refunds under different keys can never
//! exceed what was captured, here or at the processor.

use std::time::Duration;

use idem::{Interrupted, Lease, Operation, PhaseError, Step, boxed};
use provider::{CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, RefundRequest};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::reconcile::{
    Reconciled, adopt_or_move_on, plan_of, planned_call, refused_at_a_later_generation,
    when_nothing_found,
};
use super::{
    LeaseInfo, current_payment, failure_code, internal, problem_answer, record, refund_answer,
    refusal, unavailable,
};
use crate::DomainError;
use crate::events::{self, EventType};
use crate::ids::{AccountId, PaymentId, RefundId};
use crate::money::Amount;
use crate::payments::{self, Changes, PaymentStatus};
use crate::problems::{Problem, ProblemCode};
use crate::refunds::{self, NewRefund, PendingRefund, Refund};

/// The stored name of a refund.
pub const CREATE_REFUND: &str = "refunds.create";

recovery_points!(RefundPoint { Started => "started", RefundCreated => "refund_created" });

/// The stored input of a refund.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundParams {
    /// The account.
    pub account_id: AccountId,
    /// The payment.
    pub payment_id: PaymentId,
    /// The validated request.
    pub request: NewRefund,
}

payment_operation! {
    /// `POST /v1/payments/{id}/refunds`.
    CreateRefundOp(RefundParams) = CREATE_REFUND
}

/// The refund `refund` of `charge_id`, frozen under the refund's key.
fn refund_request(refund: &Refund, charge_id: &str) -> FrozenRequest {
    RefundRequest {
        charge_id: charge_id.to_owned(),
        payment_id: refund.payment_id.to_string(),
        refund_id: Some(refund.id.to_string()),
        amount: Some(refund.amount.get()),
        reason: refund.reason.map(|reason| reason.to_string()),
    }
    .freeze(DownstreamKey::refund(&refund.id))
}

impl<P: CardProcessor> CreateRefundOp<P> {
    /// The processor cannot tell us what the refund request did: the charge's refunds say (a
    /// list, consistent at once).
    async fn reconcile(
        &self,
        lease: &mut Lease,
        refund: &Refund,
        charge_id: &str,
    ) -> Result<Reconciled<provider::Refund>, Interrupted> {
        lease.renew().await?;
        let found =
            self.ctx.processor.list_refunds(charge_id).await.map_err(|err| unavailable(&err))?;
        let mut ours: Vec<provider::Refund> = found
            .into_iter()
            .filter(|found| {
                found.metadata.get("refund_id").is_some_and(|id| refund.id == id.as_str())
            })
            .collect();
        match ours.len() {
            0 => {
                when_nothing_found(
                    lease,
                    self.ctx.processor.longest_call(),
                    Duration::ZERO,
                    "refund",
                )
                .await
            }
            1 => Ok(Reconciled::Adopt(ours.remove(0))),
            n => Err(Interrupted::NeedsHuman {
                reason: format!("{n} refunds at the processor for {}", refund.id),
            }),
        }
    }
}

impl<P: CardProcessor> Operation for CreateRefundOp<P> {
    type Point = RefundPoint;

    async fn step(&self, lease: &mut Lease, at: RefundPoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = self.ctx.public_base_url.clone();
        match at {
            RefundPoint::Started => {
                lease
                    .phase(|tx| {
                        let (params, info, base) = (self.params.clone(), info.clone(), base.clone());
                        boxed(async move {
                            let payment = payments::lock(tx, &params.account_id, &params.payment_id).await?.ok_or(DomainError::NotFound("payment"))?;
                            let refusal = |problem: Problem| Ok::<_, PhaseError<DomainError>>(Step::Finish(problem_answer(&problem, &info.request_id, &base)));
                            if payment.status != PaymentStatus::Succeeded {
                                return refusal(Problem::new(
                                    ProblemCode::PaymentUnexpectedState,
                                    format!("The payment is `{}`; only a captured (`succeeded`) payment can be refunded.", payment.status),
                                ));
                            }
                            let remaining = payment.amount_captured - payment.amount_refunded;
                            let amount = params.request.amount.map_or(remaining, Amount::get);
                            if remaining == 0 || amount > remaining {
                                return refusal(
                                    Problem::new(
                                        ProblemCode::AmountTooLarge,
                                        format!("The refund of {amount} is more than what remains refundable ({remaining})."),
                                    )
                                    .with_param("amount"),
                                );
                            }
                            payments::update(tx, &payment.id, &Changes { refunded_delta: amount, ..Changes::default() }, None).await?;
                            let id = RefundId::generate();
                            let refund = refunds::insert(tx, &PendingRefund {
                                id: &id,
                                account_id: &params.account_id,
                                payment_id: &payment.id,
                                key_id: info.key_id,
                                amount: Amount::new(amount).ok_or(DomainError::Corrupt("a refund of more than a payment can hold"))?,
                                currency: payment.currency,
                                reason: params.request.reason,
                                metadata: &params.request.metadata,
                            })
                            .await?;
                            record(tx, &params.account_id, &refund.id, "refund.created", &info, json!({"payment": payment.id, "amount": amount})).await?;
                            let charge_id = payment.processor_charge_id.as_deref().ok_or(DomainError::Corrupt("a captured payment without a charge"))?;
                            Ok(Step::Call(RefundPoint::RefundCreated, plan_of(&refund_request(&refund, charge_id))))
                        })
                    })
                    .await?;
            }
            RefundPoint::RefundCreated => {
                let refund = refunds::find_by_key(&self.ctx.pool, info.key_id)
                    .await
                    .map_err(internal)?
                    .ok_or_else(|| {
                        internal("the key is past `refund_created` but has no refund")
                    })?;
                let payment =
                    current_payment(&self.ctx.pool, &self.params.account_id, &refund.payment_id)
                        .await?;
                let charge_id = payment
                    .processor_charge_id
                    .clone()
                    .ok_or_else(|| internal("a captured payment without a charge"))?;
                let request =
                    planned_call(lease, at, || refund_request(&refund, &charge_id)).await?;
                idem::failpoint(|| format!("{CREATE_REFUND}.before_call")).await;
                let outcome = self.ctx.processor.create_refund(&request).await;
                idem::failpoint(|| format!("{CREATE_REFUND}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let found = self.reconcile(lease, &refund, &charge_id).await?;
                        let object = (&*refund.account_id, &*refund.id, "refund.reconciled");
                        match adopt_or_move_on(lease, at, &request, object, "refund", &err, found)
                            .await?
                        {
                            Some((found, detail)) => (Ok(found), Some(detail)),
                            None => return Ok(()),
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                // Stripe answers a refund that is still on its way (`pending`,
                // `requires_action`) or that did not go through after all (`failed`,
                // `canceled`) with a 200 too: only `succeeded` says the money moved back. Any
                // other status is neither a success nor a refusal this code may record, so a
                // person looks (the amount stays reserved against the payment meanwhile).
                if let Ok(found) = &outcome
                    && found.status != "succeeded"
                {
                    return Err(Interrupted::NeedsHuman {
                        reason: format!(
                            "the processor answered refund {} of {charge_id} with status `{}`, not `succeeded`",
                            found.id, found.status
                        ),
                    });
                }
                let key = request.key.clone();
                let problem =
                    refusal(&outcome, &payment.id)?.zip(outcome.as_ref().err().map(failure_code));
                let processor_refund_id = outcome.as_ref().ok().map(|r| r.id.clone());
                lease
                    .phase(|tx| {
                        let (refund, info, base, problem, key, processor_refund_id, reconciled) = (refund.clone(), info.clone(), base.clone(), problem.clone(), key.clone(), processor_refund_id.clone(), reconciled.clone());
                        boxed(async move {
                            if let Some(detail) = reconciled {
                                record(tx, &refund.account_id, &refund.id, "refund.reconciled", &info, detail).await?;
                            }
                            let step = match problem {
                                None => {
                                    let refund = refunds::settle(tx, &refund.id, processor_refund_id.as_deref(), None).await?;
                                    record(tx, &refund.account_id, &refund.id, "refund.succeeded", &info, json!({"processor_refund": processor_refund_id, "downstream_key": key.as_str()})).await?;
                                    events::record(tx, &refund.account_id, EventType::RefundSucceeded, &refund.to_json()).await?;
                                    Step::<RefundPoint>::Finish(refund_answer(&refund))
                                }
                                Some((problem, code)) => {
                                    // Give the reservation back: the money did not move.
                                    let failed = refunds::settle(tx, &refund.id, None, Some(&code)).await?;
                                    payments::update(tx, &refund.payment_id, &Changes { refunded_delta: -refund.amount.get(), ..Changes::default() }, None).await?;
                                    record(tx, &refund.account_id, &refund.id, "refund.failed", &info, json!({"detail": problem.detail})).await?;
                                    events::record(tx, &refund.account_id, EventType::RefundFailed, &failed.to_json()).await?;
                                    Step::Finish(problem_answer(&problem, &info.request_id, &base))
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
