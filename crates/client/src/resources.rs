//! The API's objects as the client reads them ([`Payment`], [`Refund`], a page of a [`List`]) and
//! sends them ([`NewPayment`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A payment, as the API represents it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Payment {
    /// `pay_…`
    pub id: String,
    /// Minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// `processing`, `requires_capture`, `succeeded`, `failed`, `canceled`.
    pub status: String,
    /// `automatic` or `manual`.
    pub capture_method: String,
    /// Captured so far.
    pub amount_captured: i64,
    /// Refunded so far.
    pub amount_refunded: i64,
    /// Whether all of it was refunded.
    pub refunded: bool,
    /// The payment method token.
    pub payment_method: String,
    /// Free text.
    pub description: Option<String>,
    /// String pairs.
    pub metadata: BTreeMap<String, String>,
    /// The processor's charge.
    pub processor_charge_id: Option<String>,
    /// Decline code, for a failed payment.
    pub failure_code: Option<String>,
    /// Unix seconds.
    pub created: i64,
}

/// A refund, as the API represents it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Refund {
    /// `re_…`
    pub id: String,
    /// The refunded payment.
    pub payment: String,
    /// Minor units.
    pub amount: i64,
    /// `succeeded`, …
    pub status: String,
}

/// A page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct List<T> {
    /// Newest first.
    pub data: Vec<T>,
    /// Whether more lie beyond.
    pub has_more: bool,
}

/// `POST /v1/payments`
#[derive(Debug, Clone, Serialize)]
pub struct NewPayment {
    /// Minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// A payment method token.
    pub payment_method: String,
    /// `automatic` (default) or `manual`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_method: Option<String>,
    /// Free text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// String pairs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Where to send a receipt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_email: Option<String>,
}

impl NewPayment {
    /// A payment of `amount` minor units of `currency` with `payment_method`.
    pub fn new(amount: i64, currency: &str, payment_method: &str) -> Self {
        Self {
            amount,
            currency: currency.to_owned(),
            payment_method: payment_method.to_owned(),
            capture_method: None,
            description: None,
            metadata: BTreeMap::new(),
            receipt_email: None,
        }
    }
}
