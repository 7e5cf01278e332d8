//! `POST /v1/payments/{id}/refunds`: `started` → `refund_created` → finished. The first phase
//! locks the payment and reserves the amount, so concurrent refunds under different keys can never
//! exceed what was captured, here or at the processor.

use std::time::Duration;

use idem::{Interrupted, Lease, Operation, Phase, PhaseError, Step};
use provider::{CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, RefundRequest};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::reconcile::{
    Reconciled, adopt_or_move_on, plan_of, planned_call, refused_at_a_later_generation,
    when_nothing_found,
};
use super::{
    LeaseInfo, current_payment, failure_code, internal, problem_answer, record, record_reconciled,
    refund_answer, refusal, unavailable,
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

    async fn step(&mut self, lease: &mut Lease, at: RefundPoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = &self.ctx.public_base_url;
        match at {
            RefundPoint::Started => {
                lease.phase(Reserve { params: &self.params, info: &info, base }).await?;
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
                let problem =
                    refusal(&outcome, &payment.id)?.zip(outcome.as_ref().err().map(failure_code));
                let processor_refund_id = outcome.as_ref().ok().map(|found| found.id.as_str());
                let finish = Refunded {
                    refund: &refund,
                    processor_refund_id,
                    problem: problem.as_ref().map(|(problem, code)| (problem, code.as_str())),
                    key: &request.key,
                    reconciled: reconciled.as_ref(),
                    info: &info,
                    base,
                };
                lease.phase(finish).await?;
            }
        }
        Ok(())
    }
}

/// The first phase: locks the payment, refuses unless it is captured with enough left to refund,
/// reserves the amount against it and creates the refund, with the processor's refund frozen at
/// `refund_created`.
struct Reserve<'a> {
    params: &'a RefundParams,
    info: &'a LeaseInfo,
    base: &'a str,
}

impl Phase for Reserve<'_> {
    type Point = RefundPoint;
    type Error = DomainError;

    async fn run(
        &mut self,
        tx: &mut PgConnection,
    ) -> Result<Step<RefundPoint>, PhaseError<DomainError>> {
        let (params, info) = (self.params, self.info);
        let payment = payments::lock(tx, &params.account_id, &params.payment_id)
            .await?
            .ok_or(DomainError::NotFound("payment"))?;
        let refuse = |problem: Problem| {
            Ok(Step::Finish(problem_answer(&problem, &info.request_id, self.base)))
        };
        if payment.status != PaymentStatus::Succeeded {
            return refuse(Problem::new(
                ProblemCode::PaymentUnexpectedState,
                format!(
                    "The payment is `{}`; only a captured (`succeeded`) payment can be refunded.",
                    payment.status
                ),
            ));
        }
        let remaining = payment.amount_captured - payment.amount_refunded;
        let amount = params.request.amount.map_or(remaining, Amount::get);
        if remaining == 0 || amount > remaining {
            return refuse(
                Problem::new(
                    ProblemCode::AmountTooLarge,
                    format!(
                        "The refund of {amount} is more than what remains refundable ({remaining})."
                    ),
                )
                .with_param("amount"),
            );
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
        let charge_id = payment
            .processor_charge_id
            .as_deref()
            .ok_or(DomainError::Corrupt("a captured payment without a charge"))?;
        Ok(Step::Call(RefundPoint::RefundCreated, plan_of(&refund_request(&refund, charge_id))))
    }
}

/// The last phase: the refund `succeeded`; or, refused, it `failed` and its amount goes back to
/// the payment (the money did not move), and the refusal is the answer.
struct Refunded<'a> {
    refund: &'a Refund,
    /// The processor's refund, when it made one.
    processor_refund_id: Option<&'a str>,
    /// The processor's refusal as a problem, and its failure code.
    problem: Option<(&'a Problem, &'a str)>,
    key: &'a DownstreamKey,
    /// What reconciliation found, when it answered for the call.
    reconciled: Option<&'a Value>,
    info: &'a LeaseInfo,
    base: &'a str,
}

impl Phase for Refunded<'_> {
    type Point = RefundPoint;
    type Error = DomainError;

    async fn run(
        &mut self,
        tx: &mut PgConnection,
    ) -> Result<Step<RefundPoint>, PhaseError<DomainError>> {
        let (refund, info) = (self.refund, self.info);
        let object = (&*refund.account_id, &*refund.id, "refund.reconciled");
        record_reconciled(tx, object, info, self.reconciled).await?;
        if let Some((problem, code)) = self.problem {
            let failed = refunds::settle(tx, &refund.id, None, Some(code)).await?;
            let back = Changes { refunded_delta: -refund.amount.get(), ..Changes::default() };
            payments::update(tx, &refund.payment_id, &back, None).await?;
            let detail = json!({"detail": problem.detail});
            record(tx, &refund.account_id, &refund.id, "refund.failed", info, detail).await?;
            events::record(tx, &refund.account_id, EventType::RefundFailed, &failed.to_json())
                .await?;
            return Ok(Step::Finish(problem_answer(problem, &info.request_id, self.base)));
        }
        let refund = refunds::settle(tx, &refund.id, self.processor_refund_id, None).await?;
        let detail = json!({
            "processor_refund": self.processor_refund_id,
            "downstream_key": self.key.as_str(),
        });
        record(tx, &refund.account_id, &refund.id, "refund.succeeded", info, detail).await?;
        events::record(tx, &refund.account_id, EventType::RefundSucceeded, &refund.to_json())
            .await?;
        Ok(Step::Finish(refund_answer(&refund)))
    }
}
