//! The processor's objects and the requests we send, in the Stripe wire format's subset.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::keys::DownstreamKey;

/// A charge at the processor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    #[serde(default)]
    pub failure_code: Option<String>,
    /// For people: the `message` of the 402 its creation answered.
    #[serde(default)]
    pub failure_message: Option<String>,
    /// How it was decided; Stripe sends it on every charge, a processor may not.
    #[serde(default)]
    pub outcome: Option<ChargeOutcome>,
    /// Our ids on it (`payment_id`), as the client sent them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
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

/// A refund at the processor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// `re_…`
    pub id: String,
    /// The refunded charge.
    pub charge: String,
    /// Refunded amount.
    pub amount: i64,
    /// `succeeded`.
    pub status: String,
    /// Our ids on it (`payment_id`, `refund_id`), as the client sent them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A charge to create.
#[derive(Clone)]
pub struct ChargeRequest {
    /// Our payment's id; sent as `metadata[payment_id]`.
    pub payment_id: String,
    /// Amount in minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// The card token (`pm_…`/`tok_…`). Never logged in full.
    pub source: String,
    /// `false` only authorizes (manual capture).
    pub capture: bool,
    /// Free text.
    pub description: Option<String>,
    /// Further `metadata[…]` members, beside `payment_id` (a deployment's own tags).
    pub metadata: BTreeMap<String, String>,
}

impl ChargeRequest {
    /// The request as it will be sent, under `key`, on every attempt.
    pub fn freeze(&self, key: DownstreamKey) -> FrozenRequest {
        let mut form = vec![
            ("amount".to_owned(), self.amount.to_string()),
            ("currency".to_owned(), self.currency.clone()),
            ("source".to_owned(), self.source.clone()),
            ("capture".to_owned(), self.capture.to_string()),
            ("metadata[payment_id]".to_owned(), self.payment_id.clone()),
        ];
        for (name, value) in &self.metadata {
            if name != "payment_id" {
                form.push((format!("metadata[{name}]"), value.clone()));
            }
        }
        if let Some(description) = &self.description {
            form.push(("description".to_owned(), description.clone()));
        }
        FrozenRequest { path: "/v1/charges".to_owned(), form, key }
    }
}

impl std::fmt::Debug for ChargeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChargeRequest")
            .field("payment_id", &self.payment_id)
            .field("amount", &self.amount)
            .field("currency", &self.currency)
            .field("source", &mask_token(&self.source))
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

/// A refund to create (or an authorization to release, for an uncaptured charge).
#[derive(Debug, Clone)]
pub struct RefundRequest {
    /// The charge.
    pub charge_id: String,
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
    /// The request as it will be sent, under `key`, on every attempt.
    pub fn freeze(&self, key: DownstreamKey) -> FrozenRequest {
        let mut form = vec![
            ("charge".to_owned(), self.charge_id.clone()),
            ("metadata[payment_id]".to_owned(), self.payment_id.clone()),
        ];
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

/// A processor request decided once, in the phase before the call, and stored: every attempt, by
/// any process and any release, sends exactly this path, these fields in this order, and this
/// key. Nothing changed afterwards (the local object, a default, the code) can change it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenRequest {
    /// The path, e.g. `/v1/charges`.
    pub path: String,
    /// The form's fields, in the order sent.
    pub form: Vec<(String, String)>,
    /// The downstream idempotency key, with its generation.
    pub key: DownstreamKey,
}

impl FrozenRequest {
    /// The capture of charge `charge_id`, all of it or `amount`.
    pub fn capture(charge_id: &str, amount: Option<i64>, key: DownstreamKey) -> Self {
        let form = amount.map(|a| ("amount".to_owned(), a.to_string())).into_iter().collect();
        Self { path: format!("/v1/charges/{charge_id}/capture"), form, key }
    }

    /// The same request under the key's next generation.
    pub fn next_generation(&self) -> Self {
        let key = self.key.generation(self.key.generation_number() + 1);
        Self { key, ..self.clone() }
    }

    /// A form field's value.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

impl std::fmt::Debug for FrozenRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let form: Vec<(&str, String)> = self
            .form
            .iter()
            .map(|(k, v)| (k.as_str(), if k == "source" { mask_token(v) } else { v.clone() }))
            .collect();
        f.debug_struct("FrozenRequest")
            .field("path", &self.path)
            .field("form", &form)
            .field("key", &self.key)
            .finish()
    }
}

/// A card token as it may appear in logs: its first few characters.
pub fn mask_token(token: &str) -> String {
    let shown: String = token.chars().take(8).collect();
    if shown.len() < token.len() { format!("{shown}…") } else { "…".to_owned() }
}

/// Stripe's error object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ErrorBody {
    /// `card_error`, `invalid_request_error`, `api_error`, `idempotency_error`, `rate_limit_error`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `card_declined`, `resource_missing`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// For card errors: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// For people.
    #[serde(default)]
    pub message: String,
    /// The offending parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// For declines: the failed charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
}

/// The envelope around an error object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    /// The error.
    pub error: ErrorBody,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_masked() {
        assert_eq!(mask_token("pm_card_chargeDeclined"), "pm_card_…");
        assert_eq!(mask_token("short"), "…");
        let request = ChargeRequest {
            payment_id: "pay_1".into(),
            amount: 1,
            currency: "usd".into(),
            source: "tok_visa_4242424242424242".into(),
            capture: true,
            description: None,
            metadata: BTreeMap::new(),
        };
        assert!(!format!("{request:?}").contains("4242"));
        let frozen = request.freeze(DownstreamKey::charge("pay_1"));
        assert!(!format!("{frozen:?}").contains("4242"));
        assert_eq!(frozen.field("metadata[payment_id]"), Some("pay_1"));
        assert_eq!(frozen.next_generation().key.as_str(), "pay_1/charge/2");
    }

    /// A declined charge as Stripe sends it (`pm_card_chargeDeclinedInsufficientFunds`).
    fn declined_charge() -> serde_json::Value {
        serde_json::json!({
            "id": "ch_1", "object": "charge", "amount": 500, "currency": "usd",
            "captured": false, "paid": false, "status": "failed", "amount_captured": 0,
            "amount_refunded": 0, "refunded": false, "failure_code": "card_declined",
            "failure_message": "Your card has insufficient funds.",
            "outcome": {"network_status": "declined_by_network", "reason": "insufficient_funds",
                        "risk_level": "normal", "risk_score": 12,
                        "seller_message": "The bank returned the decline code `insufficient_funds`.",
                        "type": "issuer_declined"},
            "metadata": {"payment_id": "pay_1"},
        })
    }

    #[test]
    fn a_declined_charge_is_declined_for_its_outcomes_reason_not_its_failure_code() {
        let charge: Charge = serde_json::from_value(declined_charge()).unwrap();
        assert_eq!(charge.failure_code.as_deref(), Some("card_declined"));
        assert_eq!(charge.failure_message.as_deref(), Some("Your card has insufficient funds."));
        let outcome = charge.outcome.as_ref().unwrap();
        assert_eq!(outcome.type_.as_deref(), Some("issuer_declined"));
        assert_eq!(outcome.network_status.as_deref(), Some("declined_by_network"));
        assert_eq!(charge.decline_code(), "insufficient_funds");
    }

    #[test]
    fn without_an_outcome_the_failure_code_stands_in_and_without_a_reason_the_decline_is_generic() {
        let mut bare = declined_charge();
        bare.as_object_mut().unwrap().remove("outcome");
        let charge: Charge = serde_json::from_value(bare).unwrap();
        assert_eq!(charge.decline_code(), "card_declined");

        let mut no_reason = declined_charge();
        no_reason["outcome"]["reason"] = serde_json::Value::Null;
        let charge: Charge = serde_json::from_value(no_reason).unwrap();
        assert_eq!(charge.decline_code(), "generic_decline");

        let mut nothing = declined_charge();
        nothing["outcome"] = serde_json::Value::Null;
        nothing["failure_code"] = serde_json::Value::Null;
        let charge: Charge = serde_json::from_value(nothing).unwrap();
        assert_eq!(charge.decline_code(), "generic_decline");
    }

    #[test]
    fn a_charge_blocked_by_risk_rules_is_not_declined_for_the_rule_it_names() {
        let mut blocked = declined_charge();
        blocked["outcome"]["type"] = "blocked".into();
        blocked["outcome"]["reason"] = "highest_risk_level".into();
        let charge: Charge = serde_json::from_value(blocked).unwrap();
        assert_eq!(charge.decline_code(), "card_declined");
    }

    #[test]
    fn a_successful_charges_outcome_has_no_reason() {
        let success = serde_json::json!({
            "id": "ch_2", "object": "charge", "amount": 500, "currency": "usd", "captured": true,
            "paid": true, "status": "succeeded", "amount_captured": 500, "amount_refunded": 0,
            "refunded": false, "failure_code": null, "failure_message": null,
            "outcome": {"network_status": "approved_by_network", "reason": null,
                        "risk_level": "normal", "seller_message": "Payment complete.",
                        "type": "authorized"},
        });
        let charge: Charge = serde_json::from_value(success).unwrap();
        let outcome = charge.outcome.unwrap();
        assert_eq!((outcome.type_.as_deref(), outcome.reason), (Some("authorized"), None));
    }
}
