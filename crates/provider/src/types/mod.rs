//! The processor's objects and the requests we send, in the Stripe wire format's subset: charges
//! (`charge`, as the processor's `charge.*` webhook events carry them), refunds (`refund`), PaymentIntents (`payment_intent`), the frozen form every
//! money-moving call sends ([`FrozenRequest`]), and Stripe's error object. Answers are read
//! leniently (`lenient`): unknown fields are ignored and fields a server may omit have defaults,
//! so only a field the code uses can make an answer unreadable.

mod charge;
mod lenient;
mod payment_intent;
mod refund;

pub use charge::{Charge, ChargeOutcome};
pub use payment_intent::{
    IntentStatus, NextAction, PaymentError, PaymentIntent, PaymentIntentRequest, RedirectToUrl,
};
pub use refund::{Refund, RefundRequest};

use serde::{Deserialize, Serialize};

use crate::keys::DownstreamKey;
use lenient::id_or_expanded;

/// A processor request decided once, in the phase before the call, and stored: every attempt, by
/// any process and any release, sends exactly this path, these fields in this order, and this
/// key. Nothing changed afterwards (the local object, a default, the code) can change it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenRequest {
    /// The path, e.g. `/v1/payment_intents`.
    pub path: String,
    /// The form's fields, in the order sent.
    pub form: Vec<(String, String)>,
    /// The downstream idempotency key, with its generation.
    pub key: DownstreamKey,
}

impl FrozenRequest {
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
            .map(|(k, v)| {
                let card = k == "source" || k == "payment_method";
                (k.as_str(), if card { mask_token(v) } else { v.clone() })
            })
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
    /// For declines: the failed charge (an id, or the expanded charge).
    #[serde(default, deserialize_with = "id_or_expanded", skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
    /// For declines of a PaymentIntent: the intent, which Stripe sends whole inside the error;
    /// only its id is read.
    #[serde(default, deserialize_with = "id_or_expanded", skip_serializing_if = "Option::is_none")]
    pub payment_intent: Option<String>,
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
    fn tokens_are_masked_and_a_next_generation_changes_only_the_key() {
        assert_eq!(mask_token("pm_card_chargeDeclined"), "pm_card_…");
        assert_eq!(mask_token("short"), "…");
        let frozen = FrozenRequest {
            path: "/v1/payment_intents".to_owned(),
            form: vec![
                ("payment_method".to_owned(), "tok_visa_4242424242424242".to_owned()),
                ("source".to_owned(), "tok_visa_4242424242424242".to_owned()),
                ("metadata[payment_id]".to_owned(), "pay_1".to_owned()),
            ],
            key: DownstreamKey::charge("pay_1"),
        };
        assert!(!format!("{frozen:?}").contains("4242"));
        assert_eq!(frozen.field("metadata[payment_id]"), Some("pay_1"));
        let next = frozen.next_generation();
        assert_eq!(next.key.as_str(), "pay_1/charge/2");
        assert_eq!((next.path.as_str(), &next.form), (frozen.path.as_str(), &frozen.form));
    }
}
