//! The stand-in's books: what it holds (charges, refunds, PaymentIntents, idempotency records, the
//! search indexes, the events waiting for the webhook dispatcher, the counters) and the helpers
//! its operations share. The operations are in the modules below, one responsibility each:
//! [`charges`] (create, capture, retrieve), [`refunds`], [`lists`], [`search`],
//! [`payment_intents`] (their own books and operations), with Stripe's test cards in
//! [`test_cards`]; [`idempotency`] runs a POST's operation under Stripe's idempotency rules;
//! [`control`] is what the `/_sim` surface asks of the books (a reset, the clock).
//!
//! Every object records its account: the secret key of the request that made it, as the stand-in
//! knows no other notion of an account (a kept idempotency key belongs to its secret key too).

mod charges;
mod control;
mod idempotency;
mod lists;
mod payment_intents;
mod refunds;
mod search;
mod test_cards;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::http::StatusCode;
use rand::Rng;
use rand::distributions::Alphanumeric;
use serde::Serialize;
use serde_json::{Value, json};

use crate::answer::Answer;
use crate::clock::Clock;
use crate::webhooks::{self, EventType};
use idempotency::KeyStore;
pub(crate) use idempotency::Post;
use payment_intents::IntentBook;
pub(crate) use payment_intents::{AuthenticationOutcome, IntentListQuery};
use search::MetadataIndex;

/// Counters, as `GET /_sim/stats` shows them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Requests to `/v1`, faulted ones included.
    pub requests: u64,
    /// Charge objects created, declined ones included.
    pub charges_created: u64,
    /// Captures performed.
    pub captures: u64,
    /// Refund objects created (releases of uncaptured charges included).
    pub refunds_created: u64,
    /// Requests answered from an idempotency record.
    pub idempotent_replays: u64,
    /// Requests that drew a fault.
    pub faults_injected: u64,
    /// Requests refused because their key was first used with other parameters or another path.
    pub idempotency_errors: u64,
    /// Idempotency records forgotten because they outlived `key_ttl_s` (found when their key
    /// came back, or swept out as the records grew).
    pub keys_expired: u64,
    /// Requests to `GET /v1/charges/search`, refused ones included.
    pub searches: u64,
    /// Webhook events raised while an endpoint was set (`charge.succeeded`, …).
    pub events_created: u64,
    /// Webhook attempts posted, failed ones and duplicates included.
    pub webhooks_sent: u64,
    /// Webhook attempts answered 2xx (a duplicate delivery counts again).
    pub webhooks_delivered: u64,
    /// Webhook deliveries given up after every attempt failed.
    pub webhooks_abandoned: u64,
    /// Webhook events lost because the dispatcher's queue was full.
    pub webhooks_dropped: u64,
    /// PaymentIntent objects created.
    pub payment_intents_created: u64,
    /// Requests to `GET /v1/payment_intents/search`, refused ones included.
    pub payment_intent_searches: u64,
    /// PaymentIntents canceled.
    pub payment_intents_canceled: u64,
    /// Authentications (3-D Secure) that nobody completed within `authentication_ttl_s`.
    pub authentications_expired: u64,
}

#[derive(Debug, Clone)]
struct ChargeRecord {
    id: String,
    /// The secret key that made it.
    account: Arc<str>,
    amount: i64,
    currency: String,
    captured: bool,
    paid: bool,
    status: &'static str,
    amount_captured: i64,
    amount_refunded: i64,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    /// Stripe's `outcome`: how the charge was decided.
    outcome: Outcome,
    /// The PaymentIntent it was made under (`None`: made by `POST /v1/charges`).
    payment_intent: Option<String>,
    created: u64,
    /// When it was made, on the stand-in's clock: search sees it `search_lag_ms` later.
    created_ms: u64,
}

impl ChargeRecord {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id, "object": "charge", "amount": self.amount, "currency": self.currency,
            "captured": self.captured, "paid": self.paid, "status": self.status,
            "amount_captured": self.amount_captured, "amount_refunded": self.amount_refunded,
            "refunded": self.amount_refunded == self.amount && self.paid,
            "description": self.description, "metadata": self.metadata,
            "failure_code": self.failure_code, "failure_message": self.failure_message,
            "outcome": self.outcome.to_json(), "payment_intent": self.payment_intent,
            "created": self.created,
        })
    }
}

/// A charge's `outcome`, as Stripe puts it on every charge: approved by the network, or declined
/// by the issuer with the decline code as its `reason` (the 402's `decline_code`; the charge's
/// `failure_code` is the 402's `code`).
#[derive(Debug, Clone)]
enum Outcome {
    Authorized,
    IssuerDeclined { reason: &'static str },
}

impl Outcome {
    fn to_json(&self) -> Value {
        match self {
            Self::Authorized => json!({
                "network_status": "approved_by_network", "reason": null, "risk_level": "normal",
                "seller_message": "Payment complete.", "type": "authorized",
            }),
            Self::IssuerDeclined { reason } => {
                let seller_message = if *reason == "generic_decline" {
                    "The bank did not return any further details with this decline.".to_owned()
                } else {
                    format!("The bank returned the decline code `{reason}`.")
                };
                json!({
                    "network_status": "declined_by_network", "reason": reason,
                    "risk_level": "normal", "seller_message": seller_message,
                    "type": "issuer_declined",
                })
            }
        }
    }
}

#[derive(Debug, Clone)]
struct RefundRecord {
    id: String,
    /// The secret key that made it.
    account: Arc<str>,
    charge: String,
    /// The PaymentIntent of the charge, if it was made under one.
    payment_intent: Option<String>,
    amount: i64,
    reason: Option<String>,
    metadata: BTreeMap<String, String>,
    created: u64,
}

impl RefundRecord {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id, "object": "refund", "charge": self.charge,
            "payment_intent": self.payment_intent, "amount": self.amount,
            "status": "succeeded", "reason": self.reason, "metadata": self.metadata,
            "created": self.created,
        })
    }
}

/// Everything the stand-in knows.
#[derive(Debug)]
pub(crate) struct Ledger {
    clock: Clock,
    charges: Vec<ChargeRecord>,
    charge_index: HashMap<String, usize>,
    /// Charges by metadata, for search.
    metadata_index: MetadataIndex,
    refunds: Vec<RefundRecord>,
    /// The positions in `refunds` of each charge's refunds (by the charge's position), oldest
    /// first; only charges with refunds have an entry.
    refunds_by_charge: HashMap<usize, Vec<usize>>,
    /// PaymentIntents, with their own index, search index and pending authentications.
    intents: IntentBook,
    keys: KeyStore,
    /// The secret key of the POST running now: the account of what it makes.
    acting_account: Arc<str>,
    /// What the operation running now changed, for its events (stamped with its key after it).
    raised: Vec<(EventType, Value)>,
    /// Events stamped and waiting for the webhook dispatcher.
    events: Vec<Value>,
    pub stats: Stats,
}

impl Ledger {
    pub(crate) fn new(clock: Clock) -> Self {
        Self {
            clock,
            charges: Vec::new(),
            charge_index: HashMap::new(),
            metadata_index: MetadataIndex::default(),
            refunds: Vec::new(),
            refunds_by_charge: HashMap::new(),
            intents: IntentBook::default(),
            keys: KeyStore::default(),
            acting_account: Arc::from(""),
            raised: Vec::new(),
            events: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// The events raised since the last call, each as its webhook's body.
    pub(crate) fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    /// Turns what the operation just run changed into events carrying its idempotency key.
    fn stamp_events(&mut self, idempotency_key: Option<&str>) {
        let created = self.unix_now_s();
        for (kind, object) in std::mem::take(&mut self.raised) {
            self.events.push(webhooks::event(kind, object, idempotency_key, created));
        }
    }

    /// A new object's `created`: the unix time as the stand-in sees it (its real start plus the
    /// time since, `POST /_sim/clock`'s advances included).
    fn next_created(&mut self) -> u64 {
        self.clock.unix_now_s()
    }

    /// Unix seconds now, on the stand-in's clock (a test's clock moves it).
    fn unix_now_s(&self) -> u64 {
        self.clock.unix_now_s()
    }
}

/// A new object id, Stripe's way: the prefix (`ch`, `re`, `evt`), then 24 random characters.
pub(crate) fn new_id(prefix: &str) -> String {
    let random: String =
        rand::thread_rng().sample_iter(&Alphanumeric).take(24).map(char::from).collect();
    format!("{prefix}_{random}")
}

/// The last value of a form parameter.
fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The `metadata[key]=value` parameters, as a map.
fn metadata(params: &[(String, String)]) -> BTreeMap<String, String> {
    params
        .iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((key.to_owned(), v.clone()))
        })
        .collect()
}

/// A positive amount parameter, if sent; anything else is refused before the operation begins.
fn amount(params: &[(String, String)], name: &str) -> Result<Option<i64>, Answer> {
    match param(params, name) {
        None => Ok(None),
        Some(raw) => match raw.parse::<i64>() {
            Ok(value) if value > 0 => Ok(Some(value)),
            _ => Err(Answer::bad_param(
                "parameter_invalid_integer",
                Some(name),
                "Invalid positive integer",
            )),
        },
    }
}

fn no_such_charge(param: &str) -> Answer {
    Answer::error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "resource_missing",
        Some(param),
        "No such charge.",
    )
}
