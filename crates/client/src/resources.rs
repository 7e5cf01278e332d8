//! The API's objects as the client reads them ([`Payment`] with its [`PaymentStatus`] and
//! [`NextAction`], [`Refund`], a page of a [`List`]) and sends them ([`NewPayment`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// A payment, as the API represents it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Payment {
    /// `pay_…`
    pub id: String,
    /// Minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// Where the payment is in its life.
    pub status: PaymentStatus,
    /// What the customer must do while the payment `requires_action`; `None` otherwise (and from
    /// a server that does not send it).
    #[serde(default)]
    pub next_action: Option<NextAction>,
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
    /// The processor's PaymentIntent, `pi_…`.
    #[serde(default)]
    pub processor_payment_intent_id: Option<String>,
    /// The processor's charge, `ch_…`.
    pub processor_charge_id: Option<String>,
    /// Decline code, for a failed payment.
    pub failure_code: Option<String>,
    /// Unix seconds.
    pub created: i64,
}

impl Payment {
    /// Where to send the customer to authenticate, while the payment `requires_action`.
    pub fn redirect_url(&self) -> Option<&str> {
        let action = self.next_action.as_ref()?;
        action.redirect_to_url.as_ref().map(|redirect| redirect.url.as_str())
    }
}

/// Where a payment is in its life. A status this client does not know yet is kept as
/// [`PaymentStatus::Other`], never an error, so that a newer server's answers still read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PaymentStatus {
    /// `processing`: a request or the server's completer is working on it.
    Processing,
    /// `requires_action`: the customer must authenticate (3-D Secure) at
    /// [`Payment::redirect_url`]. The outcome arrives later: read the payment again, or listen
    /// for its event. A capture or cancel meanwhile is refused with
    /// [`Code::PaymentRequiresAction`](crate::Code::PaymentRequiresAction).
    RequiresAction,
    /// `requires_capture`: authorized; waits for a capture or a cancel.
    RequiresCapture,
    /// `succeeded`: captured.
    Succeeded,
    /// `failed`: declined, or the customer did not authenticate.
    Failed,
    /// `canceled`: released, or its authentication expired (`abandoned`).
    Canceled,
    /// Any other status, as sent.
    Other(String),
}

impl PaymentStatus {
    /// The status named `name`.
    pub fn parse(name: &str) -> Self {
        match name {
            "processing" => Self::Processing,
            "requires_action" => Self::RequiresAction,
            "requires_capture" => Self::RequiresCapture,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "canceled" => Self::Canceled,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The status's name, as the API writes it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Processing => "processing",
            Self::RequiresAction => "requires_action",
            Self::RequiresCapture => "requires_capture",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Other(name) => name,
        }
    }
}

impl fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for PaymentStatus {
    fn eq(&self, name: &str) -> bool {
        self.as_str() == name
    }
}

impl PartialEq<&str> for PaymentStatus {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

impl<'de> Deserialize<'de> for PaymentStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(Self::parse(&name))
    }
}

/// What a payment that `requires_action` asks of its customer:
/// `{"type": "redirect_to_url", "redirect_to_url": {"url": …}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NextAction {
    /// `redirect_to_url` (the only kind the API sends today).
    #[serde(rename = "type")]
    pub kind: String,
    /// Where to send the customer, for a `redirect_to_url`.
    #[serde(default)]
    pub redirect_to_url: Option<RedirectToUrl>,
}

/// Where the customer authenticates.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RedirectToUrl {
    /// The processor's authentication page.
    pub url: String,
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
