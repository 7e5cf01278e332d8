//! What tells a capture from a cancel ([`AuthorizationAction`]): the names each writes, the call
//! each freezes, how a PaymentIntent shows the call acted, and what the call did ([`Acted`]) as
//! the last phase records it.

use provider::{DownstreamKey, FrozenRequest, IntentStatus, PaymentIntent};
use serde_json::{Value, json};

use crate::events::EventType;
use crate::money::Amount;
use crate::operations::cancel::{CANCEL_PAYMENT, cancel_request};
use crate::operations::capture::{CAPTURE_PAYMENT, capture_request};
use crate::payments::{CancellationReason, Changes, PaymentStatus};

/// What a capture or a cancel does to the payment's authorization: all that tells the two apart
/// follows from it.
#[derive(Debug, Clone, Copy)]
pub(in crate::operations) enum AuthorizationAction {
    /// Capture it.
    Capture {
        /// How much of it (default: all of it).
        amount: Option<Amount>,
    },
    /// Release it.
    Cancel {
        /// Why, as the canceled payment records it.
        reason: Option<CancellationReason>,
    },
}

/// The names a capture or a cancel writes, in one place.
pub(super) struct Names {
    /// The operation's stored name, which its failpoints start with (`….before_call`).
    pub(super) operation: &'static str,
    /// The operation in reconciliation's counters and messages.
    pub(super) what: &'static str,
    /// What only a payment that `requires_capture` can be, in the refusal of any other.
    pub(super) done: &'static str,
    /// The audit action of the first phase.
    pub(super) started: &'static str,
    /// The audit action of a final refusal by the processor.
    pub(super) refused: &'static str,
    /// The audit action of the last phase when the call acted.
    pub(super) acted: &'static str,
    /// The event of the last phase when the call acted.
    pub(super) event: EventType,
}

impl AuthorizationAction {
    pub(super) fn names(self) -> Names {
        match self {
            Self::Capture { .. } => Names {
                operation: CAPTURE_PAYMENT,
                what: "capture",
                done: "captured",
                started: "payment.capture_started",
                refused: "payment.capture_refused",
                acted: "payment.captured",
                event: EventType::PaymentCaptured,
            },
            Self::Cancel { .. } => Names {
                operation: CANCEL_PAYMENT,
                what: "cancel",
                done: "canceled",
                started: "payment.cancel_started",
                refused: "payment.cancel_refused",
                acted: "payment.canceled",
                event: EventType::PaymentCanceled,
            },
        }
    }

    /// The call to the processor, frozen under the operation's own key: each capture and each
    /// cancel has one (`DownstreamKey::capture`, `DownstreamKey::cancel`), from the payment, its
    /// PaymentIntent and the operation's key, its row `key_id`.
    pub(super) fn frozen_request(
        self,
        payment_id: &str,
        intent_id: &str,
        key_id: i64,
    ) -> FrozenRequest {
        match self {
            Self::Capture { amount } => capture_request(payment_id, intent_id, amount, key_id),
            Self::Cancel { reason } => cancel_request(payment_id, intent_id, reason, key_id),
        }
    }

    /// Whether `intent` shows that the call acted: it `succeeded`, or is `canceled`.
    pub(super) fn shows_done(self, intent: &PaymentIntent) -> bool {
        match self {
            Self::Capture { .. } => intent.status == IntentStatus::Succeeded,
            Self::Cancel { .. } => intent.status == IntentStatus::Canceled,
        }
    }

    /// What the call did, as `intent`, which shows that it acted, says. A compatible server may
    /// leave `amount_received` out: then the capture's own amount, or the whole authorization.
    pub(super) fn acted(self, intent: &PaymentIntent) -> Acted {
        match self {
            Self::Capture { amount } => {
                let asked = amount.map_or(intent.amount, Amount::get);
                let received = intent.amount_received.unwrap_or(asked);
                Acted::Captured { amount_captured: received }
            }
            Self::Cancel { reason } => Acted::Released { reason },
        }
    }
}

/// What the call did, as the last phase records it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Acted {
    /// The payment `succeeded`, with the amount the processor's charge says it captured.
    Captured { amount_captured: i64 },
    /// The authorization is released: the payment is `canceled`, for the cancel's reason.
    Released { reason: Option<CancellationReason> },
}

impl Acted {
    /// The payment's new status, and what goes with it.
    pub(super) fn changes(self) -> Changes<'static> {
        match self {
            Self::Captured { amount_captured } => Changes {
                status: Some(PaymentStatus::Succeeded),
                amount_captured: Some(amount_captured),
                ..Changes::default()
            },
            Self::Released { reason } => Changes {
                status: Some(PaymentStatus::Canceled),
                cancellation_reason: reason,
                ..Changes::default()
            },
        }
    }

    /// The detail of the last phase's audit record, with the call's downstream `key`.
    pub(super) fn audit_detail(self, key: &DownstreamKey) -> Value {
        match self {
            Self::Captured { amount_captured } => {
                json!({"amount_captured": amount_captured, "downstream_key": key.as_str()})
            }
            Self::Released { .. } => json!({"downstream_key": key.as_str()}),
        }
    }
}
