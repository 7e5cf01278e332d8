//! The stand-in's books: charges, refunds, idempotency records, the search index and counters.

use std::collections::{BTreeMap, HashMap};

use axum::http::StatusCode;
use rand::Rng;
use rand::distributions::Alphanumeric;
use serde::Serialize;
use serde_json::{Value, json};

use super::clock::Clock;
use super::faults::{FaultConfig, Idempotency};
use super::idempotency::{Found, IdempotencyRecord, KeyStore, request_line, slot};
use super::search::{self, MetadataIndex};
use super::webhooks::{self, ChargeEvent};

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
}

/// One answer, ready to send.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub status: StatusCode,
    pub body: Value,
    /// Sent from an idempotency record.
    pub replayed: bool,
    /// The operation began executing: it was not refused on the request's form or parameters.
    /// In `stripe` mode this is what decides that the key keeps the answer.
    pub executed: bool,
    /// The key keeps this answer (or it came from a record): a kept 500 will be replayed, so
    /// retrying it cannot help.
    pub kept: bool,
}

impl Answer {
    fn ok(body: Value) -> Self {
        Self { status: StatusCode::OK, body, replayed: false, executed: true, kept: false }
    }

    /// An error the operation raised once it was executing (a missing charge, a charge in the
    /// wrong state): kept against the key in `stripe` mode.
    pub(super) fn error(
        status: StatusCode,
        type_: &str,
        code: &str,
        param: Option<&str>,
        message: &str,
    ) -> Self {
        let mut error = json!({"type": type_, "code": code, "message": message});
        if let Some(param) = param {
            error["param"] = param.into();
        }
        Self {
            status,
            body: json!({ "error": error }),
            replayed: false,
            executed: true,
            kept: false,
        }
    }

    /// A refusal before the operation began (no API key, a malformed body, a parameter that
    /// fails validation): never kept, so a corrected retry with the same key executes.
    pub(super) fn refused(
        status: StatusCode,
        type_: &str,
        code: &str,
        param: Option<&str>,
        message: &str,
    ) -> Self {
        Self { executed: false, ..Self::error(status, type_, code, param, message) }
    }

    /// A 400 the operation raised.
    fn invalid(code: &str, param: Option<&str>, message: &str) -> Self {
        Self::error(StatusCode::BAD_REQUEST, "invalid_request_error", code, param, message)
    }

    /// A 400 for a parameter that fails validation, before the operation began.
    fn bad_param(code: &str, param: Option<&str>, message: &str) -> Self {
        Self::refused(StatusCode::BAD_REQUEST, "invalid_request_error", code, param, message)
    }

    /// The "500 after processing" fault's answer: the operation happened, the caller is told
    /// that something failed. Stripe's `api_error` carries no code.
    fn error_after_processing() -> Self {
        let body = json!({"error": {
            "type": "api_error",
            "message": "An error occurred with our connection to the processor after the request was processed (injected).",
        }});
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body,
            replayed: false,
            executed: true,
            kept: false,
        }
    }

    /// Stripe's answer to a key reused with other parameters: `idempotency_error`, no code.
    fn idempotency_error(key: &str) -> Self {
        let message = format!(
            "Keys for idempotent requests can only be used with the same parameters they were \
             first used with. Try using a key other than '{key}' if you meant to execute a \
             different request."
        );
        let body = json!({"error": {"type": "idempotency_error", "message": message}});
        Self {
            status: StatusCode::BAD_REQUEST,
            body,
            replayed: false,
            executed: false,
            kept: false,
        }
    }

    /// Stripe's refusal of an idempotency key longer than it keeps.
    fn key_too_long() -> Self {
        let message = format!(
            "Keys for idempotent requests can be at most {MAX_KEY_LENGTH} characters long."
        );
        let body = json!({"error": {"type": "invalid_request_error", "message": message}});
        Self {
            status: StatusCode::BAD_REQUEST,
            body,
            replayed: false,
            executed: false,
            kept: false,
        }
    }

    /// Whether the key keeps this answer under `rule`.
    fn is_kept(&self, rule: Idempotency) -> bool {
        match rule {
            Idempotency::Stripe => self.executed,
            Idempotency::Lenient => {
                self.status.is_success() || self.status == StatusCode::PAYMENT_REQUIRED
            }
        }
    }
}

#[derive(Debug, Clone)]
struct ChargeRecord {
    id: String,
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
            "failure_code": self.failure_code, "created": self.created,
        })
    }

    fn holds(&self, clause: &search::Clause) -> bool {
        self.metadata.get(&clause.key) == Some(&clause.value)
    }
}

#[derive(Debug, Clone)]
struct RefundRecord {
    id: String,
    charge: String,
    amount: i64,
    reason: Option<String>,
    metadata: BTreeMap<String, String>,
    created: u64,
}

impl RefundRecord {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id, "object": "refund", "charge": self.charge, "amount": self.amount,
            "status": "succeeded", "reason": self.reason, "metadata": self.metadata,
            "created": self.created,
        })
    }
}

/// Stripe's longest idempotency key; it also bounds what a record can hold.
const MAX_KEY_LENGTH: usize = 255;

/// A POST, as the idempotency rules see it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Post<'a> {
    /// The caller's API key: idempotency keys belong to it.
    pub api_key: &'a str,
    /// The `Idempotency-Key` header, if sent.
    pub key: Option<&'a str>,
    /// The path, part of what a retry must match.
    pub path: &'a str,
    /// The form's parameters, as sent.
    pub params: &'a [(String, String)],
    /// The request drew the "500 after processing" fault.
    pub error_after_processing: bool,
}

/// Everything the stand-in knows.
#[derive(Debug)]
pub(super) struct Ledger {
    clock: Clock,
    charges: Vec<ChargeRecord>,
    charge_index: HashMap<String, usize>,
    /// Charges by metadata, for search.
    metadata_index: MetadataIndex,
    refunds: Vec<RefundRecord>,
    /// The positions in `refunds` of each charge's refunds (by the charge's position), oldest
    /// first; only charges with refunds have an entry.
    refunds_by_charge: HashMap<usize, Vec<usize>>,
    keys: KeyStore,
    sequence: u64,
    /// What the operation running now changed, for its events (stamped with its key after it).
    raised: Vec<(ChargeEvent, Value)>,
    /// Events stamped and waiting for the webhook dispatcher.
    events: Vec<Value>,
    pub stats: Stats,
}

/// The outcome of a payment-method token, as Stripe's test cards decide it.
enum TokenOutcome {
    Succeeds,
    Declined { code: &'static str, decline_code: &'static str, message: &'static str },
}

fn token_outcome(token: &str) -> Option<TokenOutcome> {
    let declined =
        |code, decline_code, message| Some(TokenOutcome::Declined { code, decline_code, message });
    match token {
        "pm_card_visa" | "pm_card_mastercard" | "tok_visa" | "tok_mastercard" => {
            Some(TokenOutcome::Succeeds)
        }
        "pm_card_chargeDeclined" | "tok_chargeDeclined" => {
            declined("card_declined", "generic_decline", "Your card was declined.")
        }
        "pm_card_chargeDeclinedInsufficientFunds" | "tok_chargeDeclinedInsufficientFunds" => {
            declined("card_declined", "insufficient_funds", "Your card has insufficient funds.")
        }
        "pm_card_chargeDeclinedExpiredCard" | "tok_chargeDeclinedExpiredCard" => {
            declined("expired_card", "expired_card", "Your card has expired.")
        }
        _ => None,
    }
}

pub(super) fn new_id(prefix: &str) -> String {
    let random: String =
        rand::thread_rng().sample_iter(&Alphanumeric).take(24).map(char::from).collect();
    format!("{prefix}_{random}")
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn metadata(params: &[(String, String)]) -> BTreeMap<String, String> {
    params
        .iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((key.to_owned(), v.clone()))
        })
        .collect()
}

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

/// Stripe's lists take at most 100 a page, 10 unless told.
fn page_size(limit: Option<usize>) -> usize {
    limit.unwrap_or(10).clamp(1, 100)
}

impl Ledger {
    pub(super) fn new(clock: Clock) -> Self {
        Self {
            clock,
            charges: Vec::new(),
            charge_index: HashMap::new(),
            metadata_index: MetadataIndex::default(),
            refunds: Vec::new(),
            refunds_by_charge: HashMap::new(),
            keys: KeyStore::default(),
            sequence: 0,
            raised: Vec::new(),
            events: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// The events raised since the last call, each as its webhook's body.
    pub(super) fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    /// Turns what the operation just run changed into events carrying its idempotency key.
    fn stamp_events(&mut self, idempotency_key: Option<&str>) {
        for (kind, charge) in std::mem::take(&mut self.raised) {
            self.events.push(webhooks::event(kind, charge, idempotency_key));
        }
    }

    fn next_created(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence
    }

    /// Runs a POST under Stripe's idempotency rules: the same key with the same parameters
    /// returns the kept answer; with other parameters (or on another path) it is an
    /// `idempotency_error`; a record older than `key_ttl_s` is forgotten. Which answers are kept
    /// is `config.idempotency`'s rule. If the request drew the "500 after processing" fault and
    /// the operation executes, its answer is replaced by a 500, and the 500 is what the key keeps.
    pub(super) fn idempotent(
        &mut self,
        post: Post<'_>,
        config: &FaultConfig,
        run: impl FnOnce(&mut Self, &[(String, String)]) -> Answer,
    ) -> Answer {
        let Post { api_key, key, path, params, error_after_processing } = post;
        let execute = |ledger: &mut Self| {
            let answer = run(ledger, params);
            ledger.stamp_events(key);
            if error_after_processing && answer.executed {
                Answer::error_after_processing()
            } else {
                answer
            }
        };
        let Some(key) = key else { return execute(self) };
        if key.len() > MAX_KEY_LENGTH {
            return Answer::key_too_long();
        }
        let mut sorted = params.to_vec();
        sorted.sort();
        let request = request_line(path, &sorted);
        let slot = slot(api_key, key);
        let now_ms = self.clock.now_ms();
        let ttl_ms = config.key_ttl_ms();
        match self.keys.find(&slot, now_ms, ttl_ms) {
            Found::Record(record) if record.request != request => {
                self.stats.idempotency_errors += 1;
                return Answer::idempotency_error(key);
            }
            Found::Record(record) => {
                let (status, body) = (record.status, serde_json::from_str(&record.body));
                self.stats.idempotent_replays += 1;
                let body = body.unwrap_or(Value::Null);
                return Answer { status, body, replayed: true, executed: true, kept: true };
            }
            Found::Expired => self.stats.keys_expired += 1,
            Found::Nothing => {}
        }
        let mut answer = execute(self);
        if answer.is_kept(config.idempotency) {
            answer.kept = true;
            let body = answer.body.to_string().into_boxed_str();
            let record =
                IdempotencyRecord { request, body, stored_at_ms: now_ms, status: answer.status };
            self.stats.keys_expired += self.keys.keep(slot, record, ttl_ms);
        }
        answer
    }

    pub(super) fn create_charge(&mut self, params: &[(String, String)]) -> Answer {
        let amount = match amount(params, "amount") {
            Ok(Some(amount)) => amount,
            Ok(None) => {
                return Answer::bad_param(
                    "parameter_missing",
                    Some("amount"),
                    "Missing required param: amount.",
                );
            }
            Err(answer) => return answer,
        };
        let currency = match param(params, "currency") {
            Some(c) if c.len() == 3 && c.bytes().all(|b| b.is_ascii_lowercase()) => c.to_owned(),
            _ => {
                return Answer::bad_param(
                    "parameter_invalid",
                    Some("currency"),
                    "Invalid currency.",
                );
            }
        };
        let Some(source) = param(params, "source") else {
            return Answer::bad_param(
                "parameter_missing",
                Some("source"),
                "Missing required param: source.",
            );
        };
        let capture = match param(params, "capture") {
            None | Some("true") => true,
            Some("false") => false,
            Some(_) => {
                return Answer::bad_param(
                    "parameter_invalid",
                    Some("capture"),
                    "capture must be true or false.",
                );
            }
        };
        // Looking the payment method up is part of executing, as at Stripe: an unknown one is
        // an answer the key keeps.
        let Some(outcome) = token_outcome(source) else {
            return Answer::invalid("resource_missing", Some("source"), "No such payment method.");
        };
        let created = self.next_created();
        let mut charge = ChargeRecord {
            id: new_id("ch"),
            amount,
            currency,
            captured: false,
            paid: false,
            status: "failed",
            amount_captured: 0,
            amount_refunded: 0,
            description: param(params, "description").map(str::to_owned),
            metadata: metadata(params),
            failure_code: None,
            created,
            created_ms: self.clock.now_ms(),
        };
        let answer = match outcome {
            TokenOutcome::Succeeds => {
                charge.paid = true;
                charge.status = "succeeded";
                if capture {
                    charge.captured = true;
                    charge.amount_captured = amount;
                }
                Answer::ok(charge.to_json())
            }
            TokenOutcome::Declined { code, decline_code, message } => {
                charge.failure_code = Some(code.to_owned());
                let body = json!({"error": {
                    "type": "card_error", "code": code, "decline_code": decline_code,
                    "message": message, "charge": charge.id,
                }});
                Answer { status: StatusCode::PAYMENT_REQUIRED, body, ..Answer::ok(Value::Null) }
            }
        };
        self.stats.charges_created += 1;
        let kind = if charge.paid { ChargeEvent::Succeeded } else { ChargeEvent::Failed };
        self.raised.push((kind, charge.to_json()));
        let position = self.charges.len();
        for (key, value) in &charge.metadata {
            self.metadata_index.add(key, value, position);
        }
        self.charge_index.insert(charge.id.clone(), position);
        self.charges.push(charge);
        answer
    }

    fn charge_mut(&mut self, id: &str) -> Option<&mut ChargeRecord> {
        let index = *self.charge_index.get(id)?;
        self.charges.get_mut(index)
    }

    pub(super) fn capture(&mut self, id: &str, params: &[(String, String)]) -> Answer {
        let requested = match amount(params, "amount") {
            Ok(requested) => requested,
            Err(answer) => return answer,
        };
        let Some(charge) = self.charge_mut(id) else {
            return no_such_charge("charge");
        };
        if !charge.paid || charge.captured || charge.amount_refunded > 0 {
            return Answer::invalid(
                "charge_already_captured",
                None,
                "This charge cannot be captured.",
            );
        }
        let captured = requested.unwrap_or(charge.amount);
        if captured > charge.amount {
            return Answer::invalid(
                "amount_too_large",
                Some("amount"),
                "Cannot capture more than was authorized.",
            );
        }
        charge.captured = true;
        charge.amount_captured = captured;
        // As Stripe does, the uncaptured remainder is released.
        charge.amount_refunded = charge.amount - captured;
        let body = charge.to_json();
        self.stats.captures += 1;
        self.raised.push((ChargeEvent::Captured, body.clone()));
        Answer::ok(body)
    }

    pub(super) fn create_refund(&mut self, params: &[(String, String)]) -> Answer {
        let requested = match amount(params, "amount") {
            Ok(requested) => requested,
            Err(answer) => return answer,
        };
        let Some(charge_id) = param(params, "charge").map(str::to_owned) else {
            return Answer::bad_param(
                "parameter_missing",
                Some("charge"),
                "Missing required param: charge.",
            );
        };
        let reason = param(params, "reason").map(str::to_owned);
        let refund_metadata = metadata(params);
        let Some(&position) = self.charge_index.get(&charge_id) else {
            return no_such_charge("charge");
        };
        let created = self.next_created();
        let Some(charge) = self.charges.get_mut(position) else {
            return no_such_charge("charge");
        };
        if !charge.paid {
            return Answer::invalid(
                "charge_not_refundable",
                Some("charge"),
                "A failed charge cannot be refunded.",
            );
        }
        let remaining = charge.amount - charge.amount_refunded;
        let amount = match requested {
            // Releasing an authorization releases all of it.
            Some(amount) if !charge.captured && amount != remaining => {
                return Answer::invalid(
                    "amount_too_large",
                    Some("amount"),
                    "An uncaptured charge is released whole.",
                );
            }
            Some(amount) => amount,
            None => remaining,
        };
        if remaining == 0 {
            return Answer::invalid(
                "charge_already_refunded",
                Some("charge"),
                "The charge has already been refunded.",
            );
        }
        if amount > remaining {
            return Answer::invalid(
                "amount_too_large",
                Some("amount"),
                "Refund amount is greater than what remains.",
            );
        }
        charge.amount_refunded += amount;
        self.raised.push((ChargeEvent::Refunded, charge.to_json()));
        let refund = RefundRecord {
            id: new_id("re"),
            charge: charge_id,
            amount,
            reason,
            metadata: refund_metadata,
            created,
        };
        let body = refund.to_json();
        self.refunds_by_charge.entry(position).or_default().push(self.refunds.len());
        self.refunds.push(refund);
        self.stats.refunds_created += 1;
        Answer::ok(body)
    }

    pub(super) fn retrieve_charge(&self, id: &str) -> Answer {
        match self.charge_index.get(id).and_then(|&i| self.charges.get(i)) {
            Some(charge) => Answer::ok(charge.to_json()),
            None => no_such_charge("id"),
        }
    }

    /// Charges, newest first. Only the page is serialized, and `starting_after` is found through
    /// the index, so a page costs the same however many charges there are.
    pub(super) fn list_charges(
        &self,
        limit: Option<usize>,
        starting_after: Option<&str>,
    ) -> Answer {
        let end = match starting_after {
            None => self.charges.len(),
            Some(id) => match self.charge_index.get(id) {
                Some(&position) => position,
                None => return no_such_object(),
            },
        };
        let older = self.charges.get(..end).unwrap_or_default();
        list_page(older.iter().rev(), limit, "/v1/charges", ChargeRecord::to_json)
    }

    /// Refunds, newest first: all of them, or those of one charge (`charge`). Only the page is
    /// serialized.
    pub(super) fn list_refunds(
        &self,
        charge: Option<&str>,
        limit: Option<usize>,
        starting_after: Option<&str>,
    ) -> Answer {
        let Some(charge) = charge else {
            return refund_page(self.refunds.iter().rev(), limit, starting_after);
        };
        let Some(position) = self.charge_index.get(charge) else {
            return no_such_charge("charge");
        };
        let of_charge = self.refunds_by_charge.get(position).map_or(&[][..], Vec::as_slice);
        let refunds = of_charge.iter().rev().filter_map(|&p| self.refunds.get(p));
        refund_page(refunds, limit, starting_after)
    }

    /// `GET /v1/charges/search`: the charges whose metadata hold every clause of `query`, newest
    /// first, leaving out those younger than `search_lag_ms`; `page` is a cursor this answered.
    pub(super) fn search_charges(
        &mut self,
        query: Option<&str>,
        limit: Option<usize>,
        page: Option<&str>,
        search_lag_ms: u64,
    ) -> Answer {
        self.stats.searches += 1;
        let Some(query) = query else {
            return Answer::bad_param(
                "parameter_missing",
                Some("query"),
                "Missing required param: query.",
            );
        };
        let clauses = match search::parse(query) {
            Ok(clauses) => clauses,
            Err(message) => return Answer::bad_param("parameter_invalid", Some("query"), &message),
        };
        let below = match page {
            None => usize::MAX,
            Some(token) => match search::read_page_token(token) {
                Some(bound) => bound,
                None => {
                    return Answer::bad_param("parameter_invalid", Some("page"), "Invalid page.");
                }
            },
        };
        // The rarest clause gives the candidates; each is checked against every clause, which
        // also drops any that only share a hash.
        let candidates = clauses
            .iter()
            .map(|clause| self.metadata_index.candidates(&clause.key, &clause.value))
            .min_by_key(|candidates| candidates.len())
            .unwrap_or_default();
        let now_ms = self.clock.now_ms();
        let mut matches =
            candidates.iter().rev().filter(|&&position| position < below).filter_map(|&position| {
                let charge = self.charges.get(position)?;
                let visible = now_ms.saturating_sub(charge.created_ms) >= search_lag_ms;
                (visible && clauses.iter().all(|clause| charge.holds(clause)))
                    .then_some((position, charge))
            });
        let limit = page_size(limit);
        let found: Vec<(usize, &ChargeRecord)> = matches.by_ref().take(limit).collect();
        let has_more = matches.next().is_some();
        let next_page = match found.last() {
            Some(&(position, _)) if has_more => Some(search::page_token(position)),
            _ => None,
        };
        let data: Vec<Value> = found.iter().map(|(_, charge)| charge.to_json()).collect();
        Answer::ok(json!({
            "object": "search_result", "data": data, "has_more": has_more,
            "next_page": next_page, "url": "/v1/charges/search",
        }))
    }
}

/// A page of refunds, newest first, after `starting_after` (found by its id: refunds are few
/// beside charges, and a scan compares ids without serializing anything).
fn refund_page<'a>(
    refunds: impl Iterator<Item = &'a RefundRecord> + Clone,
    limit: Option<usize>,
    starting_after: Option<&str>,
) -> Answer {
    let start = match starting_after {
        None => 0,
        Some(id) => match refunds.clone().position(|refund| refund.id == id) {
            Some(position) => position + 1,
            None => return no_such_object(),
        },
    };
    list_page(refunds.skip(start), limit, "/v1/refunds", RefundRecord::to_json)
}

fn no_such_object() -> Answer {
    Answer::bad_param("resource_missing", Some("starting_after"), "No such object.")
}

/// A page of a newest-first list, Stripe's way: `items` starts just after `starting_after`.
fn list_page<'a, T: 'a>(
    mut items: impl Iterator<Item = &'a T>,
    limit: Option<usize>,
    url: &str,
    to_json: impl Fn(&T) -> Value,
) -> Answer {
    let data: Vec<Value> = items.by_ref().take(page_size(limit)).map(to_json).collect();
    let has_more = items.next().is_some();
    Answer::ok(json!({"object": "list", "data": data, "has_more": has_more, "url": url}))
}
