//! The stand-in's books: charges, refunds, idempotency records and counters.

use std::collections::{BTreeMap, HashMap};

use axum::http::StatusCode;
use rand::Rng;
use rand::distributions::Alphanumeric;
use serde::Serialize;
use serde_json::{Value, json};

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
}

/// One answer, ready to send.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub status: StatusCode,
    pub body: Value,
    pub replayed: bool,
}

impl Answer {
    fn ok(body: Value) -> Self {
        Self { status: StatusCode::OK, body, replayed: false }
    }

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
        Self { status, body: json!({ "error": error }), replayed: false }
    }

    fn invalid(code: &str, param: Option<&str>, message: &str) -> Self {
        Self::error(StatusCode::BAD_REQUEST, "invalid_request_error", code, param, message)
    }

    /// Whether Stripe would keep this answer for the key: results of requests that began
    /// executing (successes and declines), not validation failures.
    fn is_kept(&self) -> bool {
        self.status.is_success() || self.status == StatusCode::PAYMENT_REQUIRED
    }
}

/// What the stand-in keeps per idempotency key, compactly: it holds one per charge, and a
/// test run makes hundreds of thousands.
#[derive(Debug)]
struct IdempotencyRecord {
    /// The path and the sorted parameters, `path?k=v&k=v`: a retry must match them exactly.
    request: String,
    status: StatusCode,
    /// The answer's body as sent.
    body: Box<str>,
}

/// `path?k=v&k=v` of a request whose parameters are sorted (`=` and `&` inside them escaped).
fn request_line(path: &str, sorted: &[(String, String)]) -> String {
    let escape = |s: &str| s.replace('%', "%25").replace('&', "%26").replace('=', "%3D");
    let params: Vec<String> =
        sorted.iter().map(|(k, v)| format!("{}={}", escape(k), escape(v))).collect();
    format!("{path}?{}", params.join("&"))
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

/// Everything the stand-in knows.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    charges: Vec<ChargeRecord>,
    charge_index: HashMap<String, usize>,
    refunds: Vec<RefundRecord>,
    idempotency: HashMap<(String, String), IdempotencyRecord>,
    sequence: u64,
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

fn new_id(prefix: &str) -> String {
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
            _ => Err(Answer::invalid(
                "parameter_invalid_integer",
                Some(name),
                "Invalid positive integer",
            )),
        },
    }
}

impl Ledger {
    fn next_created(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence
    }

    /// Stripe's idempotency: the same key with the same parameters returns the kept answer; with
    /// other parameters it is an `idempotency_error`.
    pub(super) fn idempotent(
        &mut self,
        api_key: &str,
        key: Option<String>,
        path: &str,
        params: &[(String, String)],
        run: impl FnOnce(&mut Self, &[(String, String)]) -> Answer,
    ) -> Answer {
        let Some(key) = key else { return run(self, params) };
        let mut sorted = params.to_vec();
        sorted.sort();
        let request = request_line(path, &sorted);
        let slot = (api_key.to_owned(), key);
        if let Some(record) = self.idempotency.get(&slot) {
            if record.request != request {
                return Answer::error(
                    StatusCode::BAD_REQUEST,
                    "idempotency_error",
                    "idempotency_key_in_use",
                    None,
                    "Keys for idempotent requests can only be used with the same parameters they were first used with.",
                );
            }
            self.stats.idempotent_replays += 1;
            let body = serde_json::from_str(&record.body).unwrap_or(Value::Null);
            return Answer { status: record.status, body, replayed: true };
        }
        let answer = run(self, params);
        if answer.is_kept() {
            let body = answer.body.to_string().into_boxed_str();
            self.idempotency
                .insert(slot, IdempotencyRecord { request, status: answer.status, body });
        }
        answer
    }

    pub(super) fn create_charge(&mut self, params: &[(String, String)]) -> Answer {
        let amount = match amount(params, "amount") {
            Ok(Some(amount)) => amount,
            Ok(None) => {
                return Answer::invalid(
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
                return Answer::invalid("parameter_invalid", Some("currency"), "Invalid currency.");
            }
        };
        let Some(source) = param(params, "source") else {
            return Answer::invalid(
                "parameter_missing",
                Some("source"),
                "Missing required param: source.",
            );
        };
        let Some(outcome) = token_outcome(source) else {
            return Answer::invalid("resource_missing", Some("source"), "No such payment method.");
        };
        let capture = match param(params, "capture") {
            None | Some("true") => true,
            Some("false") => false,
            Some(_) => {
                return Answer::invalid(
                    "parameter_invalid",
                    Some("capture"),
                    "capture must be true or false.",
                );
            }
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
                Answer { status: StatusCode::PAYMENT_REQUIRED, body, replayed: false }
            }
        };
        self.stats.charges_created += 1;
        self.charge_index.insert(charge.id.clone(), self.charges.len());
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
            return Answer::error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "resource_missing",
                Some("charge"),
                "No such charge.",
            );
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
        Answer::ok(body)
    }

    pub(super) fn create_refund(&mut self, params: &[(String, String)]) -> Answer {
        let requested = match amount(params, "amount") {
            Ok(requested) => requested,
            Err(answer) => return answer,
        };
        let Some(charge_id) = param(params, "charge").map(str::to_owned) else {
            return Answer::invalid(
                "parameter_missing",
                Some("charge"),
                "Missing required param: charge.",
            );
        };
        let reason = param(params, "reason").map(str::to_owned);
        let refund_metadata = metadata(params);
        let created = self.next_created();
        let Some(charge) = self.charge_mut(&charge_id) else {
            return Answer::error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "resource_missing",
                Some("charge"),
                "No such charge.",
            );
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
        let refund = RefundRecord {
            id: new_id("re"),
            charge: charge_id,
            amount,
            reason,
            metadata: refund_metadata,
            created,
        };
        let body = refund.to_json();
        self.refunds.push(refund);
        self.stats.refunds_created += 1;
        Answer::ok(body)
    }

    pub(super) fn retrieve_charge(&self, id: &str) -> Answer {
        match self.charge_index.get(id).and_then(|&i| self.charges.get(i)) {
            Some(charge) => Answer::ok(charge.to_json()),
            None => Answer::error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "resource_missing",
                Some("id"),
                "No such charge.",
            ),
        }
    }

    pub(super) fn list_charges(
        &self,
        limit: Option<usize>,
        starting_after: Option<&str>,
    ) -> Answer {
        let items: Vec<(&str, Value)> =
            self.charges.iter().rev().map(|c| (c.id.as_str(), c.to_json())).collect();
        list(items, limit, starting_after, "/v1/charges")
    }

    pub(super) fn list_refunds(
        &self,
        limit: Option<usize>,
        starting_after: Option<&str>,
    ) -> Answer {
        let items: Vec<(&str, Value)> =
            self.refunds.iter().rev().map(|r| (r.id.as_str(), r.to_json())).collect();
        list(items, limit, starting_after, "/v1/refunds")
    }
}

/// A page of a newest-first list, Stripe's way.
fn list(
    items: Vec<(&str, Value)>,
    limit: Option<usize>,
    starting_after: Option<&str>,
    url: &str,
) -> Answer {
    let limit = limit.unwrap_or(10).clamp(1, 100);
    let start = match starting_after {
        None => 0,
        Some(id) => match items.iter().position(|(item_id, _)| *item_id == id) {
            Some(position) => position + 1,
            None => {
                return Answer::invalid(
                    "resource_missing",
                    Some("starting_after"),
                    "No such object.",
                );
            }
        },
    };
    let rest = items.len().saturating_sub(start);
    let data: Vec<Value> = items.into_iter().skip(start).take(limit).map(|(_, v)| v).collect();
    Answer::ok(json!({"object": "list", "data": data, "has_more": rest > limit, "url": url}))
}
