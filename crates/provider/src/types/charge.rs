//! Stripe's Charge ([`Charge`]), read leniently: the object of the processor's `charge.*` webhook
//! events (we create PaymentIntents, never charges).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::lenient::map_or_null;

/// A charge at the processor.
///
/// Only `id`, `amount` and `currency` must be sent; every other field a Stripe-compatible
/// server (or an older API version) may leave out is filled in from what was sent, as the
/// server that omits it means it (the conversion from its wire form says how).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ChargeWire")]
pub struct Charge {
    /// `ch_…`
    pub id: String,
    /// Authorized amount, minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// Whether the charge was captured.
    pub captured: bool,
    /// Whether the authorization succeeded.
    pub paid: bool,
    /// `succeeded`, `pending` or `failed` ([`Charge::is_decided`]).
    pub status: String,
    /// Captured amount.
    pub amount_captured: i64,
    /// Refunded (or released) amount.
    pub amount_refunded: i64,
    /// Whether the whole charge was refunded or released.
    pub refunded: bool,
    /// The error code of a failed charge (`card_declined`, `expired_card`, …): the `code` of the
    /// 402 its creation answered, not why the card was declined (that is `outcome.reason`).
    pub failure_code: Option<String>,
    /// For people: the `message` of the 402 its creation answered.
    pub failure_message: Option<String>,
    /// How it was decided; Stripe sends it on every charge, a processor may not.
    pub outcome: Option<ChargeOutcome>,
    /// Our ids on it (`payment_id`), as the client sent them.
    pub metadata: BTreeMap<String, String>,
    /// The PaymentIntent it was made under, if any (an id, or the expanded object's).
    pub payment_intent: Option<String>,
}

/// A charge as it comes over the wire: everything but its identity may be missing.
#[derive(Debug, Deserialize)]
struct ChargeWire {
    id: String,
    amount: i64,
    currency: String,
    captured: Option<bool>,
    paid: Option<bool>,
    status: Option<String>,
    amount_captured: Option<i64>,
    amount_refunded: Option<i64>,
    refunded: Option<bool>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    outcome: Option<ChargeOutcome>,
    #[serde(default, deserialize_with = "map_or_null")]
    metadata: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "super::id_or_expanded")]
    payment_intent: Option<String>,
}

impl From<ChargeWire> for Charge {
    /// Each missing field as a server that leaves it out means it, erring towards "not yet":
    /// - `paid`: the status says `succeeded`;
    /// - `status`: `succeeded` when paid, `failed` when it names a failure, else `pending` (not
    ///   decided: the caller looks the charge up again rather than guess an outcome);
    /// - `captured`: some amount was captured; a server that says neither is read as not
    ///   captured, so an authorization is never recorded as money taken (a capture then
    ///   confirms it);
    /// - `amount_captured` (Stripe added it in 2020): all of `amount` when captured, else 0. Before
    ///   it, a partial capture showed its uncaptured rest as refunded, so a partially captured
    ///   charge from such a server reads as captured in full;
    /// - `amount_refunded`: all of `amount` when it says it is refunded, else 0;
    /// - `refunded`: the refunded amount covers the whole charge.
    fn from(wire: ChargeWire) -> Self {
        let paid = wire.paid.unwrap_or(wire.status.as_deref() == Some("succeeded"));
        let status = wire.status.unwrap_or_else(|| {
            let status = match (paid, &wire.failure_code) {
                (true, _) => "succeeded",
                (false, Some(_)) => "failed",
                (false, None) => "pending",
            };
            status.to_owned()
        });
        let captured = wire.captured.unwrap_or(wire.amount_captured.is_some_and(|a| a > 0));
        let amount_captured =
            wire.amount_captured.unwrap_or(if captured { wire.amount } else { 0 });
        let amount_refunded = wire.amount_refunded.unwrap_or(if wire.refunded == Some(true) {
            wire.amount
        } else {
            0
        });
        let refunded = wire.refunded.unwrap_or(wire.amount > 0 && amount_refunded >= wire.amount);
        Self {
            id: wire.id,
            amount: wire.amount,
            currency: wire.currency,
            captured,
            paid,
            status,
            amount_captured,
            amount_refunded,
            refunded,
            failure_code: wire.failure_code,
            failure_message: wire.failure_message,
            outcome: wire.outcome,
            payment_intent: wire.payment_intent,
            metadata: wire.metadata,
        }
    }
}

impl Charge {
    /// Whether the processor has decided the charge: paid, or `failed`. A charge answered with
    /// `paid=false` and any other status (Stripe's `pending`) is not a decline: its outcome
    /// comes later, by its webhook or by looking it up.
    pub fn is_decided(&self) -> bool {
        self.paid || self.status == "failed"
    }

    /// Why a failed charge was declined, as the `decline_code` of the 402 its creation answered:
    /// the `reason` of an issuer's decline (`insufficient_funds`, …). An issuer's decline without
    /// a reason is one that gave none, as a 402 without a `decline_code` is (`generic_decline`).
    /// Any other outcome (`blocked` by the processor's risk rules, whose reason names a rule, not
    /// a decline code) and a processor that sent no outcome fall back on `failure_code`, the
    /// error's code.
    pub fn decline_code(&self) -> String {
        match &self.outcome {
            Some(outcome) if outcome.type_.as_deref() == Some("issuer_declined") => {
                outcome.reason.clone()
            }
            _ => self.failure_code.clone(),
        }
        .unwrap_or_else(|| "generic_decline".to_owned())
    }
}

/// Stripe's `outcome` of a charge: how it was decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeOutcome {
    /// `authorized`, `issuer_declined`, `blocked`, `invalid`, `manual_review`.
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    /// Why the charge was declined or blocked, e.g. `insufficient_funds` (the decline code);
    /// null for a successful charge.
    #[serde(default)]
    pub reason: Option<String>,
    /// `approved_by_network`, `declined_by_network`, `not_sent_to_network`,
    /// `reversed_after_approval`.
    #[serde(default)]
    pub network_status: Option<String>,
    /// For the seller, not the customer.
    #[serde(default)]
    pub seller_message: Option<String>,
}

#[cfg(test)]
#[path = "charge_tests.rs"]
mod tests;
