//! `POST /v1/payments/{id}/capture`: `started` → `capture_started` → finished. Its phases are
//! those of every action on an authorization (`authorization`); what is a capture's own is here:
//! its input, its recovery points and the call it freezes.

use idem::{Interrupted, Lease, Operation};
use provider::{CardProcessor, DownstreamKey, FrozenRequest};
use serde::{Deserialize, Serialize};

use super::authorization::{Authorization, AuthorizationAction};
use crate::ids::{AccountId, PaymentId};
use crate::money::Amount;

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

/// The capture of `amount` of the PaymentIntent `intent_id`, frozen under this capture's own key
/// (`key_id`, the row of its idempotency key).
pub(super) fn capture_request(
    payment_id: &str,
    intent_id: &str,
    amount: Option<Amount>,
    key_id: i64,
) -> FrozenRequest {
    let key = DownstreamKey::capture(payment_id, key_id);
    FrozenRequest::capture_intent(intent_id, amount.map(Amount::get), key)
}

payment_operation! {
    /// `POST /v1/payments/{id}/capture`.
    CapturePayment(CaptureParams) = CAPTURE_PAYMENT
}

impl<P: CardProcessor> Operation for CapturePayment<P> {
    type Point = CapturePoint;

    async fn step(&mut self, lease: &mut Lease, at: CapturePoint) -> Result<(), Interrupted> {
        let CaptureParams { account_id, payment_id, amount_to_capture } = &self.params;
        let action = AuthorizationAction::Capture { amount: *amount_to_capture };
        let capture = Authorization::new(&self.ctx, account_id, payment_id, action);
        match at {
            CapturePoint::Started => capture.open(lease, CapturePoint::CaptureStarted).await,
            CapturePoint::CaptureStarted => capture.act(lease, at).await,
        }
    }
}
