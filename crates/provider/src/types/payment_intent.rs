//! Stripe's PaymentIntent ([`PaymentIntent`]), read leniently, and the calls that move one: the
//! create-and-confirm ([`PaymentIntentRequest`]), its capture and its cancel
//! ([`FrozenRequest::capture_intent`], [`FrozenRequest::cancel_intent`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::lenient::{IdOrObject, id_or_expanded, map_or_null};
use super::{FrozenRequest, mask_token};
use crate::keys::DownstreamKey;

/// Stripe's PaymentIntent, only the fields the code reads. Unknown fields are ignored, and every
/// field a compatible server or an older API version may omit has a default (see
/// the conversion from its wire form): only `id`, `amount`, `currency` and `status` must be sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "PaymentIntentWire")]
pub struct PaymentIntent {
    /// `pi_…`
    pub id: String,
    /// The amount asked for, minor units.
    pub amount: i64,
    /// What a capture may still take (an authorization awaiting capture).
    pub amount_capturable: i64,
    /// What was captured; `None` when the server did not say (a compatible server may leave it
    /// out, and then only the caller knows what a partial capture asked for).
    pub amount_received: Option<i64>,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// Where the intent stands.
    pub status: IntentStatus,
    /// Its latest charge (`ch_…`), as an id however the processor sent it.
    pub latest_charge: Option<String>,
    /// What the customer must do next, in `requires_action`.
    pub next_action: Option<NextAction>,
    /// Why the last attempt failed (a decline, a failed authentication).
    pub last_payment_error: Option<PaymentError>,
    /// Why it was canceled (`requested_by_customer`, `abandoned`, …).
    pub cancellation_reason: Option<String>,
    /// Our ids on it (`payment_id`), as the client sent them.
    pub metadata: BTreeMap<String, String>,
}

/// Where a PaymentIntent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    /// New, or declined (with a `last_payment_error`): a payment method is needed.
    RequiresPaymentMethod,
    /// Not confirmed yet (never after a create with `confirm=true` that the processor accepted).
    RequiresConfirmation,
    /// The customer must authenticate (3-D Secure): see `next_action`.
    RequiresAction,
    /// The processor has not decided yet.
    Processing,
    /// Authorized, awaiting capture (`capture_method=manual`).
    RequiresCapture,
    /// Canceled: nothing is or will be taken.
    Canceled,
    /// Captured.
    Succeeded,
    /// A status this code does not know (a newer API version's): not decided.
    #[serde(other)]
    Unknown,
}

/// What the customer must do next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextAction {
    /// `redirect_to_url`, `use_stripe_sdk`, …
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Where to send the customer, for `redirect_to_url`.
    #[serde(default)]
    pub redirect_to_url: Option<RedirectToUrl>,
}

/// A page the customer is sent to, to authenticate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedirectToUrl {
    /// The page.
    #[serde(default)]
    pub url: Option<String>,
    /// Where the page sends the customer back.
    #[serde(default)]
    pub return_url: Option<String>,
}

/// Stripe's `last_payment_error`: why the last attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentError {
    /// `card_error`, `invalid_request_error`, … (Stripe always sends it; a compatible server may
    /// not, and nothing here reads it).
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    /// `card_declined`, `payment_intent_authentication_failure`, …
    #[serde(default)]
    pub code: Option<String>,
    /// For a decline: why, e.g. `insufficient_funds`.
    #[serde(default)]
    pub decline_code: Option<String>,
    /// For people.
    #[serde(default)]
    pub message: Option<String>,
}

/// A PaymentIntent as it comes over the wire: beside its identity, anything may be missing, and
/// an older API version sends its charges as a list instead of `latest_charge`.
#[derive(Debug, Deserialize)]
struct PaymentIntentWire {
    id: String,
    amount: i64,
    amount_capturable: Option<i64>,
    amount_received: Option<i64>,
    currency: String,
    status: IntentStatus,
    #[serde(default, deserialize_with = "id_or_expanded")]
    latest_charge: Option<String>,
    charges: Option<ChargeList>,
    next_action: Option<NextAction>,
    last_payment_error: Option<PaymentError>,
    cancellation_reason: Option<String>,
    #[serde(default, deserialize_with = "map_or_null")]
    metadata: BTreeMap<String, String>,
}

/// The `charges` list of API versions before 2022-11-15, newest first.
#[derive(Debug, Deserialize)]
struct ChargeList {
    #[serde(default)]
    data: Vec<IdOrObject>,
}

impl From<PaymentIntentWire> for PaymentIntent {
    /// Each missing field as a server that leaves it out means it:
    /// - `amount_capturable`: all of `amount` while it awaits capture, else 0;
    /// - `amount_received`: left unknown (`None`): a partial capture on such a server captured
    ///   what its caller asked for, not all of `amount`, and only the caller knows which;
    /// - `latest_charge`: the newest of an older version's `charges`.
    fn from(wire: PaymentIntentWire) -> Self {
        let all_when = |status| if wire.status == status { wire.amount } else { 0 };
        let amount_capturable =
            wire.amount_capturable.unwrap_or_else(|| all_when(IntentStatus::RequiresCapture));
        let amount_received = wire.amount_received;
        let latest_charge = wire.latest_charge.or_else(|| {
            wire.charges.and_then(|list| list.data.into_iter().next()).map(IdOrObject::into_id)
        });
        Self {
            id: wire.id,
            amount: wire.amount,
            amount_capturable,
            amount_received,
            currency: wire.currency,
            status: wire.status,
            latest_charge,
            next_action: wire.next_action,
            last_payment_error: wire.last_payment_error,
            cancellation_reason: wire.cancellation_reason,
            metadata: wire.metadata,
        }
    }
}

impl PaymentIntent {
    /// Whether the processor has decided: captured, authorized, canceled, or sent back for
    /// another payment method with a reason (a decline, a failed authentication). Anything else
    /// (`requires_action`, `processing`, a status this code does not know) is decided later, by
    /// the processor's webhook or by looking the intent up.
    pub fn is_decided(&self) -> bool {
        match self.status {
            IntentStatus::Succeeded | IntentStatus::RequiresCapture | IntentStatus::Canceled => {
                true
            }
            IntentStatus::RequiresPaymentMethod => self.last_payment_error.is_some(),
            IntentStatus::RequiresConfirmation
            | IntentStatus::RequiresAction
            | IntentStatus::Processing
            | IntentStatus::Unknown => false,
        }
    }

    /// Whether the customer must act (authenticate) before the processor decides.
    pub fn needs_action(&self) -> bool {
        self.status == IntentStatus::RequiresAction
    }

    /// Where to send the customer to act, when the processor gave a page
    /// (`next_action.redirect_to_url.url`); `None` for actions that need Stripe's own SDK.
    pub fn action_url(&self) -> Option<&str> {
        self.next_action.as_ref()?.redirect_to_url.as_ref()?.url.as_deref()
    }

    /// Why the last attempt failed: its `decline_code`, else its `code`, else `generic_decline`
    /// (an error that gave no reason, as a 402 without a `decline_code` is).
    pub fn decline_code(&self) -> String {
        self.last_payment_error
            .as_ref()
            .and_then(|error| error.decline_code.clone().or_else(|| error.code.clone()))
            .unwrap_or_else(|| "generic_decline".to_owned())
    }

    /// For people: why the last attempt failed.
    pub fn failure_message(&self) -> Option<&str> {
        self.last_payment_error.as_ref()?.message.as_deref()
    }

    /// Whether the intent was made for our payment `payment_id` (its `metadata[payment_id]`).
    pub fn is_of(&self, payment_id: &str) -> bool {
        self.metadata.get("payment_id").is_some_and(|id| id == payment_id)
    }
}

/// A PaymentIntent to create and confirm in one call.
#[derive(Clone)]
pub struct PaymentIntentRequest {
    /// Our payment's id; sent as `metadata[payment_id]`.
    pub payment_id: String,
    /// Amount in minor units.
    pub amount: i64,
    /// Lower-case ISO 4217.
    pub currency: String,
    /// The payment method (`pm_…`). Never logged in full.
    pub payment_method: String,
    /// `false` only authorizes (`capture_method=manual`).
    pub capture: bool,
    /// Free text.
    pub description: Option<String>,
    /// Further `metadata[…]` members, beside `payment_id` (a deployment's own tags).
    pub metadata: BTreeMap<String, String>,
    /// Where an authentication page sends the customer back.
    pub return_url: String,
}

impl PaymentIntentRequest {
    /// The request as it will be sent, under `key`, on every attempt: `POST /v1/payment_intents`
    /// with `amount`, `currency`, `payment_method`, `confirm=true`, `capture_method`,
    /// `allowed_payment_method_types[0]=card` (cards only: no redirect unless the card's
    /// authentication needs one; `payment_method_types` before the pinned version), `return_url`, `metadata[payment_id]`, the other metadata, and `description`.
    pub fn freeze(&self, key: DownstreamKey) -> FrozenRequest {
        let capture_method = if self.capture { "automatic" } else { "manual" };
        let mut form = vec![
            ("amount".to_owned(), self.amount.to_string()),
            ("currency".to_owned(), self.currency.clone()),
            ("payment_method".to_owned(), self.payment_method.clone()),
            ("confirm".to_owned(), "true".to_owned()),
            ("capture_method".to_owned(), capture_method.to_owned()),
            ("allowed_payment_method_types[0]".to_owned(), "card".to_owned()),
            ("return_url".to_owned(), self.return_url.clone()),
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
        FrozenRequest { path: "/v1/payment_intents".to_owned(), form, key }
    }
}

impl std::fmt::Debug for PaymentIntentRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentIntentRequest")
            .field("payment_id", &self.payment_id)
            .field("amount", &self.amount)
            .field("currency", &self.currency)
            .field("payment_method", &mask_token(&self.payment_method))
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

impl FrozenRequest {
    /// The capture of PaymentIntent `intent_id`, all that is capturable or `amount_to_capture`:
    /// `POST /v1/payment_intents/{id}/capture`.
    pub fn capture_intent(
        intent_id: &str,
        amount_to_capture: Option<i64>,
        key: DownstreamKey,
    ) -> Self {
        let form = amount_to_capture
            .map(|amount| ("amount_to_capture".to_owned(), amount.to_string()))
            .into_iter()
            .collect();
        Self { path: format!("/v1/payment_intents/{intent_id}/capture"), form, key }
    }

    /// The cancel of PaymentIntent `intent_id` (`duplicate`, `fraudulent`,
    /// `requested_by_customer` or `abandoned`): `POST /v1/payment_intents/{id}/cancel`.
    pub fn cancel_intent(
        intent_id: &str,
        cancellation_reason: Option<&str>,
        key: DownstreamKey,
    ) -> Self {
        let form = cancellation_reason
            .map(|reason| ("cancellation_reason".to_owned(), reason.to_owned()))
            .into_iter()
            .collect();
        Self { path: format!("/v1/payment_intents/{intent_id}/cancel"), form, key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> PaymentIntentRequest {
        PaymentIntentRequest {
            payment_id: "pay_1".into(),
            amount: 500,
            currency: "usd".into(),
            payment_method: "pm_card_visa_4242424242424242".into(),
            capture: false,
            description: Some("Books".into()),
            metadata: BTreeMap::from([
                ("payment_id".to_owned(), "not ours".to_owned()),
                ("release".to_owned(), "42".to_owned()),
            ]),
            return_url: "https://pay.example.com/return".into(),
        }
    }

    #[test]
    fn a_payment_intent_is_frozen_with_its_fields_in_order_and_its_card_masked() {
        let frozen = request().freeze(DownstreamKey::charge("pay_1"));
        let fields: Vec<(&str, &str)> =
            frozen.form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            fields,
            [
                ("amount", "500"),
                ("currency", "usd"),
                ("payment_method", "pm_card_visa_4242424242424242"),
                ("confirm", "true"),
                ("capture_method", "manual"),
                ("allowed_payment_method_types[0]", "card"),
                ("return_url", "https://pay.example.com/return"),
                ("metadata[payment_id]", "pay_1"),
                ("metadata[release]", "42"),
                ("description", "Books"),
            ]
        );
        assert_eq!(frozen.path, "/v1/payment_intents");
        assert!(!format!("{:?}", request()).contains("4242"));
        assert!(!format!("{frozen:?}").contains("4242"));
        let automatic = PaymentIntentRequest { capture: true, ..request() };
        let frozen = automatic.freeze(DownstreamKey::charge("pay_1"));
        assert_eq!(frozen.field("capture_method"), Some("automatic"));
    }

    #[test]
    fn captures_and_cancels_name_the_intent_in_the_path() {
        let key = || DownstreamKey::capture("pay_1", 7);
        let capture = FrozenRequest::capture_intent("pi_1", Some(300), key());
        assert_eq!(capture.path, "/v1/payment_intents/pi_1/capture");
        assert_eq!(capture.form, [("amount_to_capture".to_owned(), "300".to_owned())]);
        assert!(FrozenRequest::capture_intent("pi_1", None, key()).form.is_empty());
        let cancel = FrozenRequest::cancel_intent("pi_1", Some("abandoned"), key());
        assert_eq!(cancel.path, "/v1/payment_intents/pi_1/cancel");
        assert_eq!(cancel.field("cancellation_reason"), Some("abandoned"));
        assert!(FrozenRequest::cancel_intent("pi_1", None, key()).form.is_empty());
    }
}
