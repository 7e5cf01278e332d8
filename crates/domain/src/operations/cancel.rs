//! `POST /v1/payments/{id}/cancel`: `started` → `cancel_started` → finished.

use idem::{Interrupted, Lease, Operation, StoredResponse};
use provider::{
    CardProcessor, Charge, DownstreamKey, ErrorClass, FrozenRequest, ProcessorError, RefundRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::authorization::{
    PlanCall, authorized_payment, open_phase, reconcile_authorization, reopen,
};
use super::reconcile::{
    adopted, already_refunded, count_reconciliation, planned_call, refused_at_a_later_generation,
};
use super::{
    Context, Learnt, LeaseInfo, Refused, final_outcome, payment_answer, record, record_reconciled,
    unavailable,
};
use crate::DomainError;
use crate::events::{self, EventType};
use crate::ids::{AccountId, PaymentId};
use crate::money::Amount;
pub use crate::payments::CancellationReason;
use crate::payments::{self, Changes, Payment, PaymentStatus};

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

/// The release of `charge_id`'s authorization, frozen under this cancel's own key (a cancel has
/// no amount: it releases the whole authorization).
fn cancel_request(
    payment_id: &str,
    charge_id: &str,
    _amount: Option<Amount>,
    key_id: i64,
) -> FrozenRequest {
    release_of(payment_id, charge_id).freeze(DownstreamKey::cancel(payment_id, key_id))
}

/// The refund of the whole of `charge_id`'s authorization, which releases it.
fn release_of(payment_id: &str, charge_id: &str) -> RefundRequest {
    RefundRequest {
        charge_id: charge_id.to_owned(),
        payment_id: payment_id.to_owned(),
        refund_id: None,
        amount: None,
        reason: None,
    }
}

payment_operation! {
    /// `POST /v1/payments/{id}/cancel`: releases the authorization at the processor.
    CancelPayment(CancelParams) = CANCEL_PAYMENT
}

impl<P: CardProcessor> Operation for CancelPayment<P> {
    type Point = CancelPoint;

    async fn step(&mut self, lease: &mut Lease, at: CancelPoint) -> Result<(), Interrupted> {
        match at {
            CancelPoint::Started => {
                let payment = (&self.params.account_id, &self.params.payment_id);
                let next = (CancelPoint::CancelStarted, cancel_request as PlanCall);
                open_phase(lease, payment, None, "canceled", next, &self.ctx.public_base_url)
                    .await?;
            }
            CancelPoint::CancelStarted => {
                let (info, base) = (LeaseInfo::of(lease), &self.ctx.public_base_url);
                let (account_id, payment_id) = (&self.params.account_id, &self.params.payment_id);
                let (payment, charge_id) =
                    authorized_payment(&self.ctx, account_id, payment_id).await?;
                let request = planned_call(lease).await?;
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.before_call")).await;
                let outcome = self.ctx.processor.create_refund(&request).await.map(|_| ());
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let call = (at, &request);
                        let (ctx, of) = (&self.ctx, (&payment, charge_id.as_str()));
                        let what = "cancel";
                        match reconcile_authorization(ctx, lease, call, of, what, &err, released)
                            .await?
                        {
                            Some((_charge, detail)) => (Ok(()), Some(detail)),
                            None => return Ok(()),
                        }
                    }
                    // Released already: behind the API's back (at the processor, or when the
                    // authorization expired) or by an earlier generation of this key. A release
                    // is whole, so a charge that says so answers for this cancel.
                    Err(err) if already_refunded(&err) => {
                        match released_already(&self.ctx, lease, &charge_id, &err, &request.key)
                            .await?
                        {
                            Some(detail) => (Ok(()), Some(detail)),
                            None => (refused_at_a_later_generation(&request, Err(err))?, None),
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                let outcome = final_outcome(outcome, &payment.id)?;
                let learnt = Learnt { key: &request.key, reconciled: reconciled.as_ref() };
                let reason = self.params.cancellation_reason;
                let mut tx = lease.begin().await?;
                let answer =
                    canceled(&mut tx, &payment, reason, outcome, learnt, &info, base).await?;
                tx.commit_answer(answer).await?;
            }
        }
        Ok(())
    }
}

/// Whether `charge`'s authorization is released: never captured, and all of it refunded.
fn released(charge: &Charge) -> bool {
    !charge.captured && charge.amount_refunded >= charge.amount
}

/// The refusal `cause` says the charge is refunded already: the audit detail of adopting its
/// release, if the charge says it is released ([`released`]); `None` leaves the refusal standing
/// (a charge captured and then refunded is not this cancel's to adopt).
async fn released_already<P: CardProcessor>(
    ctx: &Context<P>,
    lease: &mut Lease,
    charge_id: &str,
    cause: &ProcessorError,
    key: &DownstreamKey,
) -> Result<Option<Value>, Interrupted> {
    lease.renew().await?;
    let charge = ctx.processor.retrieve_charge(charge_id).await.map_err(|err| unavailable(&err))?;
    if !released(&charge) {
        return Ok(None);
    }
    count_reconciliation("cancel", "adopted");
    Ok(Some(adopted(cause, &charge.id, key)))
}

/// The last phase: the payment `canceled`; or, refused, the payment awaits capture again and the
/// refusal is the answer.
async fn canceled(
    tx: &mut PgConnection,
    payment: &Payment,
    reason: Option<CancellationReason>,
    outcome: Result<(), Refused>,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
    base: &str,
) -> Result<StoredResponse, DomainError> {
    let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
    record_reconciled(tx, object, info, learnt.reconciled).await?;
    if let Err(refused) = outcome {
        let what = "payment.cancel_refused";
        return reopen(tx, payment, info, &refused.problem, base, what).await;
    }
    let changes = Changes {
        status: Some(PaymentStatus::Canceled),
        cancellation_reason: reason,
        ..Changes::default()
    };
    let payment = payments::update(tx, &payment.id, &changes, None).await?;
    let detail = json!({"downstream_key": learnt.key.as_str()});
    record(tx, &payment.account_id, &payment.id, "payment.canceled", info, detail).await?;
    events::record(tx, &payment.account_id, EventType::PaymentCanceled, &payment.to_json()).await?;
    Ok(payment_answer(200, &payment, false))
}
