//! Webhooks from the card processor (`POST /webhooks/processor`): the push path of
//! reconciliation, beside search, and how the outcome of a payment that waited on its customer
//! arrives.
//!
//! A delivery is verified before anything is read ([`verify`]: Stripe's `Stripe-Signature` over
//! the exact bytes, constant-time, with a timestamp tolerance), then parsed as a Stripe event
//! about a charge or a PaymentIntent ([`Reported`]). [`receive`] is the idempotent consumer: in
//! one transaction, holding the payment's row, it records the event id (a redelivery finds it and
//! changes nothing) with its effect:
//!
//! - a payment whose creating key is still at work: the key is made due for the completer at
//!   once. The event does not change the payment: the create-payment operation, holding the
//!   key's lease, asks [`intent_for_key`] whether the processor told us what its planned call (its
//!   downstream key) made, and adopts that PaymentIntent in its own fenced phase instead of
//!   calling again or searching. So such a payment has one writer whatever the timing.
//! - a payment that `requires_action`, whose key is finished: the outcome the event reports is
//!   recorded at once (`crate::authentication::settle`), with the payment's event and webhook
//!   deliveries, in the same transaction. Its other writer, the worker's authentication job,
//!   settles it under the same row lock and the same `requires_action` guard, so it is recorded
//!   once, whichever comes first.
//! - a successful charge the payment does not account for (it records another, or it was
//!   recorded `failed` without one): an audit record for a person ([`ExtraCharge`]).
//!
//! Here: what an event is ([`ProcessorEventType`], [`Reported`], [`ProcessorEvent`]). A delivery
//! is verified in `delivery`, consumed in `consumer`; a charge the payment does not account for
//! is in `extra_charge`; the reads of recorded events in `lookups`; their deletion past
//! `retention.processor_events_days` in `retention`.

mod consumer;
mod delivery;
mod extra_charge;
mod lookups;
mod retention;

pub use consumer::{Received, receive};
pub use delivery::{Refused, check_header, verify};
pub(crate) use extra_charge::audit_extra_charge;
pub use extra_charge::{ExtraCharge, report_extra_charge};
pub use lookups::{
    Recorded, count, intent_for_key, other_succeeded_charge, paid_under_another_key,
};
pub use retention::delete_expired;

use provider::{Charge, PaymentIntent};
use serde_json::Value;

use crate::stored::{from_name, text_enum};

/// The header the processor's signature travels in.
pub use provider::signature::STRIPE_SIGNATURE_HEADER as SIGNATURE_HEADER;

text_enum! {
    /// What the processor tells us, by the processor's names (stored as they are).
    pub enum ProcessorEventType {
        /// A charge was made and authorized (captured at once or not).
        ChargeSucceeded = "charge.succeeded",
        /// A charge was made and declined.
        ChargeFailed = "charge.failed",
        /// An authorized charge was captured.
        ChargeCaptured = "charge.captured",
        /// A charge was refunded, or its authorization released.
        ChargeRefunded = "charge.refunded",
        /// A PaymentIntent succeeded: its amount was captured.
        IntentSucceeded = "payment_intent.succeeded",
        /// A PaymentIntent's attempt failed: declined, or its authentication failed.
        IntentPaymentFailed = "payment_intent.payment_failed",
        /// A PaymentIntent was authorized for a manual capture.
        IntentAmountCapturableUpdated = "payment_intent.amount_capturable_updated",
        /// A PaymentIntent waits on its customer to authenticate.
        IntentRequiresAction = "payment_intent.requires_action",
        /// A PaymentIntent was canceled.
        IntentCanceled = "payment_intent.canceled",
    }
}

impl ProcessorEventType {
    /// The type of this name; `None` for one we do not take.
    pub fn parse(name: &str) -> Option<Self> {
        from_name(name)
    }

    /// Whether its `data.object` is a PaymentIntent (else a charge).
    fn is_about_an_intent(self) -> bool {
        self.to_string().starts_with("payment_intent.")
    }

    /// Whether the event may report what the create-payment operation's call made, under its
    /// downstream key: its PaymentIntent's outcome, or (for the charges of older releases) the
    /// charge's creation.
    fn may_answer_the_create(self) -> bool {
        !matches!(self, Self::ChargeCaptured | Self::ChargeRefunded | Self::IntentCanceled)
    }
}

/// What an event reports, right after the change.
#[derive(Debug, Clone)]
pub enum Reported {
    /// A charge.
    Charge(Charge),
    /// A PaymentIntent.
    Intent(PaymentIntent),
}

impl Reported {
    /// The processor's id of it (`ch_…`, `pi_…`).
    pub fn id(&self) -> &str {
        match self {
            Self::Charge(charge) => &charge.id,
            Self::Intent(intent) => &intent.id,
        }
    }

    /// The payment its `metadata[payment_id]` names, as it is written there.
    fn payment_id(&self) -> Option<&str> {
        let metadata = match self {
            Self::Charge(charge) => &charge.metadata,
            Self::Intent(intent) => &intent.metadata,
        };
        metadata.get("payment_id").map(String::as_str)
    }
}

/// A verified event about a charge or a PaymentIntent.
#[derive(Debug, Clone)]
pub struct ProcessorEvent {
    /// The processor's `evt_…`: the dedupe key.
    pub id: String,
    /// What happened.
    pub event_type: ProcessorEventType,
    /// Unix seconds, by the processor's clock.
    pub created: i64,
    /// The object right after the change.
    pub reported: Reported,
    /// `data.object` as received, stored as evidence.
    pub object: Value,
    /// `request.idempotency_key`: the downstream key of the call that made the change (none for
    /// a change no request made, such as a customer's authentication).
    pub downstream_key: Option<String>,
}

#[cfg(test)]
mod tests;
