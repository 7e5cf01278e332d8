//! A payment as the API shows it ([`Representation`], from which the OpenAPI document's
//! `Payment` is derived), byte for byte, and its `ETag`.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{CancellationReason, CaptureMethod, Payment, PaymentStatus};
use crate::ids::PaymentId;
use crate::money::{Amount, Currency};

/// A payment as the API shows it (the OpenAPI document's `Payment` is derived from this).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Payment)]
pub struct Representation<'a> {
    /// `pay_…`
    #[schema(value_type = String, pattern = "^pay_")]
    id: &'a PaymentId,
    /// Always `payment`.
    #[schema(pattern = "^payment$")]
    object: &'static str,
    /// In the currency's minor unit.
    #[schema(value_type = i64)]
    amount: Amount,
    /// Lower-case ISO 4217.
    #[schema(value_type = String)]
    currency: Currency,
    status: PaymentStatus,
    /// Where to send the customer, while the payment `requires_action`.
    next_action: Option<NextAction<'a>>,
    capture_method: CaptureMethod,
    /// 0 until captured.
    amount_captured: i64,
    /// Refunded, or reserved by refunds in flight.
    amount_refunded: i64,
    /// Everything captured has been refunded.
    refunded: bool,
    /// The test token.
    payment_method: &'a str,
    description: Option<&'a str>,
    #[schema(value_type = BTreeMap<String, String>)]
    metadata: &'a BTreeMap<String, String>,
    receipt_email: Option<&'a str>,
    /// The processor's PaymentIntent, `pi_…`.
    processor_payment_intent_id: Option<&'a str>,
    /// The processor's charge, `ch_…`.
    processor_charge_id: Option<&'a str>,
    /// The decline code of a `failed` payment.
    failure_code: Option<&'a str>,
    /// The decline message of a `failed` payment.
    failure_message: Option<&'a str>,
    /// Why a `canceled` payment was canceled.
    #[schema(value_type = Option<String>)]
    cancellation_reason: Option<CancellationReason>,
    /// Unix seconds.
    created: i64,
    /// Always false (test mode).
    livemode: bool,
}

/// What a payment that `requires_action` asks of its customer, in Stripe's shape:
/// `{"type": "redirect_to_url", "redirect_to_url": {"url": …}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NextAction<'a> {
    /// Always `redirect_to_url`.
    #[serde(rename = "type")]
    #[schema(pattern = "^redirect_to_url$")]
    type_: &'static str,
    redirect_to_url: RedirectToUrl<'a>,
}

/// Where the customer authenticates.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RedirectToUrl<'a> {
    /// The processor's authentication page.
    url: &'a str,
}

impl Payment {
    /// The public representation, byte for byte, members in the documented order.
    pub fn to_json(&self) -> Vec<u8> {
        let representation = Representation {
            id: &self.id,
            object: "payment",
            amount: self.amount,
            currency: self.currency,
            status: self.status,
            next_action: self.next_action_url.as_deref().map(|url| NextAction {
                type_: "redirect_to_url",
                redirect_to_url: RedirectToUrl { url },
            }),
            capture_method: self.capture_method,
            amount_captured: self.amount_captured,
            amount_refunded: self.amount_refunded,
            refunded: self.amount_captured > 0 && self.amount_refunded == self.amount_captured,
            payment_method: &self.payment_method,
            description: self.description.as_deref(),
            metadata: &self.metadata,
            receipt_email: self.receipt_email.as_deref(),
            processor_payment_intent_id: self.processor_payment_intent_id.as_deref(),
            processor_charge_id: self.processor_charge_id.as_deref(),
            failure_code: self.failure_code.as_deref(),
            failure_message: self.failure_message.as_deref(),
            cancellation_reason: self.cancellation_reason,
            created: self.created,
            livemode: false,
        };
        serde_json::to_vec(&representation).unwrap_or_default()
    }

    /// The strong ETag of a representation: changes exactly when the representation does.
    pub fn etag_of(representation: &[u8]) -> String {
        let digest = Sha256::digest(representation);
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("\"{hex}\"")
    }
}
