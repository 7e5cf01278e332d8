//! The processor's objects and the requests we send, in the Stripe wire format's subset.

use serde::{Deserialize, Serialize};

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
    /// `succeeded` or `failed`.
    pub status: String,
    /// Captured amount.
    pub amount_captured: i64,
    /// Refunded (or released) amount.
    pub amount_refunded: i64,
    /// Whether the whole charge was refunded or released.
    pub refunded: bool,
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
        };
        assert!(!format!("{request:?}").contains("4242"));
    }
}
