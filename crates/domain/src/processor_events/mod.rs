//! Webhooks from the card processor (`POST /webhooks/processor`): the push path of
//! reconciliation, beside search.
//!
//! A delivery is verified before anything is read ([`verify`]: Stripe's `Stripe-Signature` over
//! the exact bytes, constant-time, with a timestamp tolerance), then parsed as a Stripe event
//! about a charge. [`receive`] is the idempotent consumer: in one transaction, holding the
//! payment's row, it records the event id (a redelivery finds it and changes nothing) with its
//! effect: the key that creates the charge's payment is made due for the completer at once, or,
//! for a successful charge the payment does not account for (it records another, or it was
//! recorded `failed` without one), an audit record for a person ([`ExtraCharge`]).
//!
//! The event never changes a payment itself. The create-payment operation, holding the key's
//! lease, asks [`charge_for_key`] whether the processor told us what its planned call (its
//! downstream key) made, and adopts that charge in its own fenced phase instead of calling again
//! or searching. So a payment has one writer whatever the timing: a request mid-call when the
//! event lands, the completer, or nobody (the key then waits for its next attempt, brought
//! forward).
//!
//! Here: what an event is ([`ChargeEventType`], [`ProcessorEvent`]). A delivery is verified in
//! `delivery`, consumed in `consumer`; a charge the payment does not account for is in
//! `extra_charge`; the reads of recorded events in `lookups`.

mod consumer;
mod delivery;
mod extra_charge;
mod lookups;

pub use consumer::{Received, receive};
pub use delivery::{Refused, check_header, verify};
pub(crate) use extra_charge::audit_extra_charge;
pub use extra_charge::{ExtraCharge, report_extra_charge};
pub use lookups::{charge_for_key, count, other_succeeded_charge, paid_under_another_key};

use provider::Charge;
use serde_json::Value;

use crate::stored::{from_name, text_enum};

/// The header the processor's signature travels in.
pub use provider::signature::STRIPE_SIGNATURE_HEADER as SIGNATURE_HEADER;

text_enum! {
    /// What the processor tells us about a charge, by the processor's names (stored as they are).
    pub enum ChargeEventType {
        /// A charge was made and authorized (captured at once or not).
        Succeeded = "charge.succeeded",
        /// A charge was made and declined.
        Failed = "charge.failed",
        /// An authorized charge was captured.
        Captured = "charge.captured",
        /// A charge was refunded, or its authorization released.
        Refunded = "charge.refunded",
    }
}

impl ChargeEventType {
    /// The type of this name; `None` for one we do not take.
    pub fn parse(name: &str) -> Option<Self> {
        from_name(name)
    }

    /// Whether the event reports the charge's creation, which the create-payment operation's
    /// downstream key made.
    fn creates(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// A verified event about a charge.
#[derive(Debug, Clone)]
pub struct ProcessorEvent {
    /// The processor's `evt_…`: the dedupe key.
    pub id: String,
    /// What happened.
    pub event_type: ChargeEventType,
    /// Unix seconds, by the processor's clock.
    pub created: i64,
    /// The charge right after the change.
    pub charge: Charge,
    /// `data.object` as received, stored as evidence.
    pub object: Value,
    /// `request.idempotency_key`: the downstream key of the call that made the change.
    pub downstream_key: Option<String>,
}

#[cfg(test)]
mod tests;
