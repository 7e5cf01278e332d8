//! Stripe's Refund ([`Refund`]), read leniently, and the refund we ask for ([`RefundRequest`]):
//! of a charge, or of a PaymentIntent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::FrozenRequest;
use super::lenient::{id_or_expanded, map_or_null};
use crate::keys::DownstreamKey;

/// A refund at the processor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// `re_…`
    pub id: String,
    /// The refunded charge, when the processor says (an id, or the expanded charge).
    #[serde(default, deserialize_with = "id_or_expanded")]
    pub charge: Option<String>,
    /// The refunded PaymentIntent, when the processor says (an id, or the expanded intent).
    #[serde(default, deserialize_with = "id_or_expanded")]
    pub payment_intent: Option<String>,
    /// Refunded amount.
    pub amount: i64,
    /// `succeeded`, `pending`, `failed`, `canceled` or `requires_action`. A server that leaves it
    /// out refunds at once, as the bundled stand-in does: `succeeded`.
    #[serde(default = "succeeded")]
    pub status: String,
    /// Our ids on it (`payment_id`, `refund_id`), as the client sent them.
    #[serde(default, deserialize_with = "map_or_null")]
    pub metadata: BTreeMap<String, String>,
}

fn succeeded() -> String {
    "succeeded".to_owned()
}

/// A refund to create (or an authorization to release, for an uncaptured charge). Exactly one
/// of `charge_id` and `payment_intent` names what is refunded; `payment_intent` is sent when
/// both are set, and a request with neither is refused by the processor (400).
#[derive(Debug, Clone)]
pub struct RefundRequest {
    /// The charge (`charge=ch_…`).
    pub charge_id: Option<String>,
    /// The PaymentIntent (`payment_intent=pi_…`).
    pub payment_intent: Option<String>,
    /// Our payment's id; sent as `metadata[payment_id]`.
    pub payment_id: String,
    /// Our refund's id, when there is one (not for a cancel); sent as `metadata[refund_id]`.
    pub refund_id: Option<String>,
    /// Amount; `None` refunds what remains.
    pub amount: Option<i64>,
    /// `duplicate`, `fraudulent`, `requested_by_customer`.
    pub reason: Option<String>,
}

impl RefundRequest {
    /// The request as it will be sent, under `key`, on every attempt: what is refunded, then
    /// `metadata[payment_id]`, `metadata[refund_id]`, `amount` and `reason`, each when set.
    pub fn freeze(&self, key: DownstreamKey) -> FrozenRequest {
        let mut form = Vec::new();
        match (&self.payment_intent, &self.charge_id) {
            (Some(intent), _) => form.push(("payment_intent".to_owned(), intent.clone())),
            (None, Some(charge)) => form.push(("charge".to_owned(), charge.clone())),
            (None, None) => {}
        }
        form.push(("metadata[payment_id]".to_owned(), self.payment_id.clone()));
        if let Some(refund_id) = &self.refund_id {
            form.push(("metadata[refund_id]".to_owned(), refund_id.clone()));
        }
        if let Some(amount) = self.amount {
            form.push(("amount".to_owned(), amount.to_string()));
        }
        if let Some(reason) = &self.reason {
            form.push(("reason".to_owned(), reason.clone()));
        }
        FrozenRequest { path: "/v1/refunds".to_owned(), form, key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(charge_id: Option<&str>, payment_intent: Option<&str>) -> RefundRequest {
        RefundRequest {
            charge_id: charge_id.map(str::to_owned),
            payment_intent: payment_intent.map(str::to_owned),
            payment_id: "pay_1".into(),
            refund_id: Some("re_1".into()),
            amount: Some(200),
            reason: None,
        }
    }

    fn names(frozen: &FrozenRequest) -> Vec<&str> {
        frozen.form.iter().map(|(name, _)| name.as_str()).collect()
    }

    #[test]
    fn a_refund_names_its_charge_or_its_payment_intent() {
        let key = || DownstreamKey::refund("re_1");
        let of_charge = request(Some("ch_1"), None).freeze(key());
        assert_eq!(
            names(&of_charge),
            ["charge", "metadata[payment_id]", "metadata[refund_id]", "amount"]
        );
        assert_eq!(of_charge.field("charge"), Some("ch_1"));
        let of_intent = request(None, Some("pi_1")).freeze(key());
        assert_eq!(
            names(&of_intent),
            ["payment_intent", "metadata[payment_id]", "metadata[refund_id]", "amount"]
        );
        assert_eq!(of_intent.field("payment_intent"), Some("pi_1"));
        assert_eq!(of_intent.path, "/v1/refunds");
    }

    #[test]
    fn a_refund_reads_with_either_reference_and_without_a_status() {
        let sparse: Refund =
            serde_json::from_value(serde_json::json!({"id": "re_1", "amount": 200})).unwrap();
        assert_eq!((sparse.charge, sparse.payment_intent), (None, None));
        assert_eq!(sparse.status, "succeeded");
        let expanded: Refund = serde_json::from_value(serde_json::json!({
            "id": "re_2", "amount": 200, "status": "pending", "charge": {"id": "ch_1"},
            "payment_intent": "pi_1", "metadata": null, "destination_details": {"type": "card"}}))
        .unwrap();
        assert_eq!(expanded.charge.as_deref(), Some("ch_1"));
        assert_eq!(expanded.payment_intent.as_deref(), Some("pi_1"));
        assert_eq!(expanded.status, "pending");
    }
}
