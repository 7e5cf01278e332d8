//! `POST /v1/payments/{id}/cancel`: `started` → `cancel_started` → finished. Its phases are those
//! of every action on an authorization (`authorization`); what is a cancel's own is here: its
//! input, its recovery points, the release it freezes, and the adoption of a release the
//! processor reports as done already.

use idem::{Interrupted, Lease, Operation};
use provider::{
    CardProcessor, Charge, DownstreamKey, FrozenRequest, ProcessorError, RefundRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::authorization::{Authorization, AuthorizationAction};
use super::reconcile::{adopted, count_reconciliation};
use super::{Context, unavailable};
use crate::ids::{AccountId, PaymentId};
pub use crate::payments::CancellationReason;

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

/// The release of `charge_id`'s authorization, frozen under this cancel's own key (`key_id`, the
/// row of its idempotency key). A cancel has no amount: it releases the whole authorization.
pub(super) fn cancel_request(payment_id: &str, charge_id: &str, key_id: i64) -> FrozenRequest {
    release_of(payment_id, charge_id).freeze(DownstreamKey::cancel(payment_id, key_id))
}

/// The refund of the whole of `charge_id`'s authorization, which releases it.
fn release_of(payment_id: &str, charge_id: &str) -> RefundRequest {
    RefundRequest {
        charge_id: Some(charge_id.to_owned()),
        payment_intent: None,
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
        let CancelParams { account_id, payment_id, cancellation_reason } = &self.params;
        let action = AuthorizationAction::Cancel { reason: *cancellation_reason };
        let cancel = Authorization::new(&self.ctx, account_id, payment_id, action);
        match at {
            CancelPoint::Started => cancel.open(lease, CancelPoint::CancelStarted).await,
            CancelPoint::CancelStarted => cancel.act(lease, at).await,
        }
    }
}

/// Whether `charge`'s authorization is released: never captured, and all of it refunded.
pub(super) fn released(charge: &Charge) -> bool {
    !charge.captured && charge.amount_refunded >= charge.amount
}

/// The refusal `cause` says the charge `charge_id` is refunded already: the charge, with the
/// audit detail of adopting its release, if it says it is released ([`released`]); `None` leaves
/// the refusal standing (a charge captured and then refunded is not this cancel's to adopt).
pub(super) async fn released_already<P: CardProcessor>(
    ctx: &Context<P>,
    lease: &mut Lease,
    charge_id: &str,
    cause: &ProcessorError,
    key: &DownstreamKey,
) -> Result<Option<(Charge, Value)>, Interrupted> {
    lease.renew().await?;
    let charge = ctx.processor.retrieve_charge(charge_id).await.map_err(|err| unavailable(&err))?;
    if !released(&charge) {
        return Ok(None);
    }
    count_reconciliation("cancel", "adopted");
    let detail = adopted(cause, &charge.id, key);
    Ok(Some((charge, detail)))
}
