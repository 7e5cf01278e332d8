//! PaymentIntents, as Stripe serves them today: the object and its books, with one module per
//! part of its life: [`create`] (create and confirm, where the test card decides), [`lifecycle`]
//! (capture, cancel, and the customer's 3-D Secure authentication: completed, failed, or expired
//! after `authentication_ttl_s`), [`reads`] (retrieve, list, search, and refunds by intent).
//!
//! A confirmation that succeeds makes a charge under the intent (its `latest_charge`, with the
//! intent's metadata, so that charge search and lists see it as they see any charge); one that is
//! declined makes a failed charge and answers Stripe's 402 with the intent inside the error; one
//! whose card asks for authentication makes no charge until the authentication is completed.

mod create;
mod lifecycle;
mod params;
mod reads;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::search::MetadataIndex;
use crate::answer::Answer;

/// Where a PaymentIntent is in its life, as Stripe names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IntentStatus {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresAction,
    /// Never reached by the stand-in (its cards decide at once), but a state Stripe has.
    #[allow(dead_code)]
    Processing,
    RequiresCapture,
    Succeeded,
    Canceled,
}

impl IntentStatus {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::RequiresPaymentMethod => "requires_payment_method",
            Self::RequiresConfirmation => "requires_confirmation",
            Self::RequiresAction => "requires_action",
            Self::Processing => "processing",
            Self::RequiresCapture => "requires_capture",
            Self::Succeeded => "succeeded",
            Self::Canceled => "canceled",
        }
    }
}

/// When the money is taken: at confirmation (`automatic`, `automatic_async`) or by a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CaptureMethod {
    Automatic,
    AutomaticAsync,
    Manual,
}

impl CaptureMethod {
    fn parse(value: &str) -> Option<Self> {
        match value {
            "automatic" => Some(Self::Automatic),
            "automatic_async" => Some(Self::AutomaticAsync),
            "manual" => Some(Self::Manual),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Automatic => "automatic",
            Self::AutomaticAsync => "automatic_async",
            Self::Manual => "manual",
        }
    }
}

/// What the customer did on the authentication page (`POST /_sim/payment_intents/{id}/
/// authenticate` with `{"outcome": "complete"}` or `{"outcome": "fail"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AuthenticationOutcome {
    /// Authenticated: the payment goes on as a confirmation that succeeded.
    Complete,
    /// Failed (or refused) the authentication.
    Fail,
}

/// A list's paging, as Stripe's lists take it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct IntentListQuery {
    /// At most this many (1 to 100; 10 unless told).
    pub limit: Option<usize>,
    /// The page of objects older than this one.
    pub starting_after: Option<String>,
    /// The page of objects newer than this one.
    pub ending_before: Option<String>,
}

/// One PaymentIntent.
#[derive(Debug, Clone)]
pub(super) struct IntentRecord {
    id: String,
    /// The secret key that made it: a reset of that key forgets it, and the charges made under
    /// it (an authentication completed later included) belong to that key too.
    account: Arc<str>,
    amount: i64,
    amount_capturable: i64,
    amount_received: i64,
    /// `automatic_payment_methods[allow_redirects]`, when automatic payment methods are on
    /// (they are unless `payment_method_types` was sent, as in Stripe's current versions).
    allow_redirects: Option<&'static str>,
    canceled_at: Option<u64>,
    cancellation_reason: Option<String>,
    capture_method: CaptureMethod,
    client_secret: String,
    created: u64,
    /// When it was made, on the stand-in's clock: search sees it `search_lag_ms` later.
    created_ms: u64,
    currency: String,
    description: Option<String>,
    last_payment_error: Option<Value>,
    latest_charge: Option<String>,
    metadata: BTreeMap<String, String>,
    next_action: Option<Value>,
    payment_method: Option<String>,
    payment_method_types: Vec<String>,
    /// Where the authentication page sends the customer back (not part of Stripe's object).
    return_url: Option<String>,
    status: IntentStatus,
    /// When it began to wait for authentication, on the stand-in's clock.
    action_since_ms: Option<u64>,
}

impl IntentRecord {
    pub(super) fn to_json(&self) -> Value {
        let automatic =
            self.allow_redirects.map(|allow| json!({"enabled": true, "allow_redirects": allow}));
        json!({
            "id": self.id, "object": "payment_intent", "amount": self.amount,
            "amount_capturable": self.amount_capturable, "amount_received": self.amount_received,
            "application": null, "application_fee_amount": null,
            "automatic_payment_methods": automatic, "canceled_at": self.canceled_at,
            "cancellation_reason": self.cancellation_reason,
            "capture_method": self.capture_method.as_str(), "client_secret": self.client_secret,
            "confirmation_method": "automatic", "created": self.created,
            "currency": self.currency, "customer": null, "description": self.description,
            "last_payment_error": self.last_payment_error, "latest_charge": self.latest_charge,
            "livemode": false, "metadata": self.metadata, "next_action": self.next_action,
            "on_behalf_of": null, "payment_method": self.payment_method,
            "payment_method_options": {"card": {"request_three_d_secure": "automatic"}},
            "payment_method_types": self.payment_method_types, "processing": null,
            "receipt_email": null, "review": null, "setup_future_usage": null, "shipping": null,
            "statement_descriptor": null, "statement_descriptor_suffix": null,
            "status": self.status.as_str(), "transfer_data": null, "transfer_group": null,
        })
    }

    pub(super) fn holds(&self, key: &str, value: &str) -> bool {
        self.metadata.get(key).is_some_and(|held| held == value)
    }
}

/// Every PaymentIntent, oldest first, with its indexes.
#[derive(Debug, Default)]
pub(super) struct IntentBook {
    records: Vec<IntentRecord>,
    index: HashMap<String, usize>,
    /// Intents by metadata, for search.
    metadata_index: MetadataIndex,
    /// Intents that began to wait for authentication, oldest first, with when: the expiry
    /// sweep's queue (an entry whose intent moved on since is skipped).
    awaiting: VecDeque<(u64, usize)>,
}

impl IntentBook {
    fn position(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    fn get(&self, position: usize) -> Option<&IntentRecord> {
        self.records.get(position)
    }

    fn get_mut(&mut self, position: usize) -> Option<&mut IntentRecord> {
        self.records.get_mut(position)
    }

    fn json(&self, position: usize) -> Value {
        self.get(position).map_or(Value::Null, IntentRecord::to_json)
    }

    /// How many intents it holds.
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Forgets the intents made with the secret key `api_key`, and builds the indexes and the
    /// queue of pending authentications again from the ones kept (their positions move).
    pub(super) fn forget_account(&mut self, api_key: &str) {
        let records = std::mem::take(&mut self.records);
        self.index.clear();
        self.metadata_index = MetadataIndex::default();
        // Old position to new, for the intents kept.
        let mut moved = HashMap::new();
        for (old, intent) in records.into_iter().enumerate() {
            if &*intent.account == api_key {
                continue;
            }
            let position = self.records.len();
            for (key, value) in &intent.metadata {
                self.metadata_index.add(key, value, position);
            }
            self.index.insert(intent.id.clone(), position);
            moved.insert(old, position);
            self.records.push(intent);
        }
        let awaiting = std::mem::take(&mut self.awaiting);
        self.awaiting = awaiting
            .into_iter()
            .filter_map(|(since_ms, old)| Some((since_ms, *moved.get(&old)?)))
            .collect();
    }
}

/// Stripe's 404 for an intent it does not have; `param` is `intent` for the path, else the
/// parameter that named it.
fn no_such_intent(id: &str, param: &str) -> Answer {
    Answer::error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "resource_missing",
        Some(param),
        &format!("No such payment_intent: '{id}'"),
    )
}

/// Stripe's documentation page of an error code, as its errors link it.
fn doc_url(code: &str) -> String {
    format!("https://stripe.com/docs/error-codes/{}", code.replace('_', "-"))
}

/// Stripe's `400 payment_intent_unexpected_state`, with the intent as it is inside the error.
fn unexpected_state(intent: Value, message: &str) -> Answer {
    let code = "payment_intent_unexpected_state";
    let body = json!({"error": {
        "type": "invalid_request_error", "code": code, "doc_url": doc_url(code),
        "message": message, "payment_intent": intent,
    }});
    Answer { status: StatusCode::BAD_REQUEST, ..Answer::ok(body) }
}

/// The payment method as an error's `payment_method` shows it.
fn payment_method_json(token: &str) -> Value {
    json!({"id": token, "object": "payment_method", "type": "card"})
}
