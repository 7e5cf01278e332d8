//! `POST /v1/payments/{id}/refunds`: `started` → `refund_created` → finished. The first phase
//! locks the payment and reserves the amount, so concurrent refunds under different keys can never
//! exceed what was captured, here or at the processor.

use std::time::Duration;

use idem::{Interrupted, Lease, Operation, StoredResponse};
use provider::{CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, RefundRequest};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;

use super::reconcile::{
    Reconciled, adopt_or_move_on, planned_call, refused_at_a_later_generation, when_nothing_found,
};
use super::{
    Learnt, LeaseInfo, Refused, current_payment, failure_code, final_outcome, internal,
    problem_answer, record, record_reconciled, refund_answer, unavailable,
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

/// The refund `refund` of the PaymentIntent `intent_id`, frozen under the refund's key.
fn refund_request(refund: &Refund, intent_id: &str) -> FrozenRequest {
    RefundRequest {
        charge_id: None,
        payment_intent: Some(intent_id.to_owned()),
        payment_id: refund.payment_id.to_string(),
        refund_id: Some(refund.id.to_string()),
        amount: Some(refund.amount.get()),
        reason: refund.reason.map(|reason| reason.to_string()),
    }
    .freeze(DownstreamKey::refund(&refund.id))
}

impl<P: CardProcessor> CreateRefundOp<P> {
    /// The processor cannot tell us what the refund request did: the PaymentIntent's refunds say
    /// (a list, consistent at once).
    async fn reconcile(
        &self,
        lease: &mut Lease,
        refund: &Refund,
        intent_id: &str,
    ) -> Result<Reconciled<provider::Refund>, Interrupted> {
        lease.renew().await?;
        let processor = &self.ctx.processor;
        let found =
            processor.list_intent_refunds(intent_id).await.map_err(|err| unavailable(&err))?;
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

    async fn step(&mut self, lease: &mut Lease, at: RefundPoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = &self.ctx.public_base_url;
        match at {
            RefundPoint::Started => {
                let mut tx = lease.begin().await?;
                match reserve(&mut tx, &self.params, &info).await? {
                    Ok(call) => tx.commit_call(RefundPoint::RefundCreated, &call).await?,
                    Err(problem) => {
                        tx.commit_answer(problem_answer(&problem, &info.request_id, base)).await?
                    }
                }
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
                let intent_id = payment
                    .processor_payment_intent_id
                    .clone()
                    .ok_or_else(|| internal("a captured payment without a PaymentIntent"))?;
                let request = planned_call(lease).await?;
                idem::failpoint(|| format!("{CREATE_REFUND}.before_call")).await;
                let outcome = self.ctx.processor.create_refund(&request).await;
                idem::failpoint(|| format!("{CREATE_REFUND}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let found = self.reconcile(lease, &refund, &intent_id).await?;
                        match adopt_or_move_on(
                            lease,
                            at,
                            &request,
                            refund.reconciled(),
                            "refund",
                            &err,
                            found,
                        )
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
                            "the processor answered refund {} of {intent_id} with status `{}`, not `succeeded`",
                            found.id, found.status
                        ),
                    });
                }
                let outcome = final_outcome(outcome.map(|found| found.id), &payment.id)?;
                let learnt = Learnt { key: &request.key, reconciled: reconciled.as_ref() };
                let mut tx = lease.begin().await?;
                let answer = settle(&mut tx, &refund, &outcome, learnt, &info, base).await?;
                tx.commit_answer(answer).await?;
            }
        }
        Ok(())
    }
}

/// The first phase: locks the payment, refuses unless it is captured with enough left to refund,
/// reserves the amount against it and creates the refund. Answers the processor's refund, to be
/// frozen at `refund_created`, or the refusal.
async fn reserve(
    tx: &mut PgConnection,
    params: &RefundParams,
    info: &LeaseInfo,
) -> Result<Result<FrozenRequest, Problem>, DomainError> {
    let payment = payments::lock(tx, &params.account_id, &params.payment_id)
        .await?
        .ok_or(DomainError::NotFound("payment"))?;
    if payment.status != PaymentStatus::Succeeded {
        return Ok(Err(Problem::new(
            ProblemCode::PaymentUnexpectedState,
            format!(
                "The payment is `{}`; only a captured (`succeeded`) payment can be refunded.",
                payment.status
            ),
        )));
    }
    let remaining = payment.amount_captured - payment.amount_refunded;
    let amount = params.request.amount.map_or(remaining, Amount::get);
    if remaining == 0 || amount > remaining {
        return Ok(Err(Problem::new(
            ProblemCode::AmountTooLarge,
            format!("The refund of {amount} is more than what remains refundable ({remaining})."),
        )
        .with_param("amount")));
    }
    let reserve = Changes { refunded_delta: amount, ..Changes::default() };
    payments::update(tx, &payment.id, &reserve, None).await?;
    let id = RefundId::generate();
    let new = PendingRefund {
        id: &id,
        account_id: &params.account_id,
        payment_id: &payment.id,
        key_id: info.key_id,
        // Within what remains refundable, which is at most the amount of a payment.
        amount: Amount::new(amount)
            .ok_or(DomainError::Corrupt("a refund of more than a payment can hold"))?,
        currency: payment.currency,
        reason: params.request.reason,
        metadata: &params.request.metadata,
    };
    let refund = refunds::insert(tx, &new).await?;
    let detail = json!({"payment": payment.id, "amount": amount});
    record(tx, &params.account_id, &refund.id, "refund.created", info, detail).await?;
    let intent_id = payment
        .processor_payment_intent_id
        .as_deref()
        .ok_or(DomainError::Corrupt("a captured payment without a PaymentIntent"))?;
    Ok(Ok(refund_request(&refund, intent_id)))
}

/// The last phase: the refund `succeeded`; or, refused, it `failed` and its amount goes back to
/// the payment (the money did not move), and the refusal is the answer.
async fn settle(
    tx: &mut PgConnection,
    refund: &Refund,
    outcome: &Result<String, Refused>,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
    base: &str,
) -> Result<StoredResponse, DomainError> {
    record_reconciled(tx, refund.reconciled(), info, learnt.reconciled).await?;
    match outcome {
        Err(Refused { err, problem }) => {
            let code = failure_code(err);
            let failed = refunds::settle(tx, &refund.id, None, Some(&code)).await?;
            let back = Changes { refunded_delta: -refund.amount.get(), ..Changes::default() };
            payments::update(tx, &refund.payment_id, &back, None).await?;
            let detail = json!({"detail": problem.detail});
            record(tx, &refund.account_id, &refund.id, "refund.failed", info, detail).await?;
            events::record(tx, &refund.account_id, EventType::RefundFailed, &failed.to_json())
                .await?;
            Ok(problem_answer(problem, &info.request_id, base))
        }
        Ok(processor_refund_id) => {
            let refund = refunds::settle(tx, &refund.id, Some(processor_refund_id), None).await?;
            let detail = json!({
                "processor_refund": processor_refund_id,
                "downstream_key": learnt.key.as_str(),
            });
            record(tx, &refund.account_id, &refund.id, "refund.succeeded", info, detail).await?;
            events::record(tx, &refund.account_id, EventType::RefundSucceeded, &refund.to_json())
                .await?;
            Ok(refund_answer(&refund))
        }
    }
}
