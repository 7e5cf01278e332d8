//! `POST /v1/payments/{id}/cancel`: `started` → `cancel_started` → finished. Its phases are those
//! of every action on an authorization (`authorization`); what is a cancel's own is here: its
//! input, its recovery points, and the cancel of the PaymentIntent it freezes.

use idem::{Interrupted, Lease, Operation};
use provider::{CardProcessor, DownstreamKey, FrozenRequest};
use serde::{Deserialize, Serialize};

use super::authorization::{Authorization, AuthorizationAction};
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

/// The cancel of the PaymentIntent `intent_id`, which releases its authorization, frozen under
/// this cancel's own key (`key_id`, the row of its idempotency key). A cancel has no amount: it
/// releases the whole authorization.
pub(super) fn cancel_request(
    payment_id: &str,
    intent_id: &str,
    reason: Option<CancellationReason>,
    key_id: i64,
) -> FrozenRequest {
    let reason = reason.map(|reason| reason.to_string());
    FrozenRequest::cancel_intent(
        intent_id,
        reason.as_deref(),
        DownstreamKey::cancel(payment_id, key_id),
    )
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
