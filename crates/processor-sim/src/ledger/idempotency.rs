//! Stripe's idempotency rules, as the stand-in runs every POST under them
//! ([`Ledger::idempotent`]), and the records they keep: one per key, compact (a run holds
//! hundreds of thousands), each with its age so that a key is forgotten after its lifetime, as at
//! Stripe.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::Ledger;
use crate::answer::Answer;
use crate::faults::{FaultConfig, Idempotency};

/// Stripe's longest idempotency key; it also bounds what a record can hold.
const MAX_KEY_LENGTH: usize = 255;

/// A POST, as the idempotency rules see it.
#[derive(Clone, Copy)]
pub(crate) struct Post<'a> {
    /// The caller's API key: idempotency keys belong to it. Never printed.
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

impl Ledger {
    /// Runs a POST under Stripe's idempotency rules: the same key with the same parameters
    /// returns the kept answer; with other parameters (or on another path) it is an
    /// `idempotency_error`; a record older than `key_ttl_s` is forgotten. Which answers are kept
    /// is `config.idempotency`'s rule. If the request drew the "500 after processing" fault and
    /// the operation executes, its answer is replaced by a 500, and the 500 is what the key keeps.
    pub(crate) fn idempotent(
        &mut self,
        post: Post<'_>,
        config: &FaultConfig,
        run: impl FnOnce(&mut Self, &[(String, String)]) -> Answer,
    ) -> Answer {
        let Post { api_key, key, path, params, error_after_processing } = post;
        if *self.acting_account != *api_key {
            self.acting_account = api_key.into();
        }
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
}

/// The answers of the idempotency rules themselves.
impl Answer {
    /// Whether the key keeps this answer under `rule`.
    fn is_kept(&self, rule: Idempotency) -> bool {
        match rule {
            Idempotency::Stripe => self.executed,
            Idempotency::Lenient => {
                self.status.is_success() || self.status == StatusCode::PAYMENT_REQUIRED
            }
        }
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
        Self::refused_by_the_rules("idempotency_error", &message)
    }

    /// Stripe's refusal of an idempotency key longer than it keeps.
    fn key_too_long() -> Self {
        let message = format!(
            "Keys for idempotent requests can be at most {MAX_KEY_LENGTH} characters long."
        );
        Self::refused_by_the_rules("invalid_request_error", &message)
    }

    /// A 400 of the rules themselves, before the operation began: never kept, and without a
    /// code, as Stripe sends it.
    fn refused_by_the_rules(type_: &str, message: &str) -> Self {
        let body = json!({"error": {"type": type_, "message": message}});
        Self {
            status: StatusCode::BAD_REQUEST,
            body,
            replayed: false,
            executed: false,
            kept: false,
        }
    }
}

/// What is kept per idempotency key.
#[derive(Debug)]
struct IdempotencyRecord {
    /// The path and the sorted parameters, `path?k=v&k=v`: a retry must match them exactly.
    pub request: Box<str>,
    /// The answer's body as sent.
    pub body: Box<str>,
    /// When it was kept, on the stand-in's clock.
    pub stored_at_ms: u64,
    pub status: StatusCode,
}

impl IdempotencyRecord {
    fn is_expired(&self, now_ms: u64, ttl_ms: u64) -> bool {
        now_ms.saturating_sub(self.stored_at_ms) >= ttl_ms
    }
}

/// `path?k=v&k=v` of a request whose parameters are sorted (`=` and `&` inside them escaped).
fn request_line(path: &str, sorted: &[(String, String)]) -> Box<str> {
    let escape = |s: &str| s.replace('%', "%25").replace('&', "%26").replace('=', "%3D");
    let params: Vec<String> =
        sorted.iter().map(|(k, v)| format!("{}={}", escape(k), escape(v))).collect();
    format!("{path}?{}", params.join("&")).into_boxed_str()
}

/// The slot of a key: keys belong to the API key that sent them. One string rather than a pair
/// saves an allocation per record; a header value cannot hold the `\n` between them.
fn slot(api_key: &str, key: &str) -> Box<str> {
    format!("{api_key}\n{key}").into_boxed_str()
}

/// What a lookup found.
#[derive(Debug)]
enum Found<'a> {
    /// No record: the request executes.
    Nothing,
    /// A record past its lifetime, now forgotten: the request executes.
    Expired,
    /// A live record.
    Record(&'a IdempotencyRecord),
}

/// Every idempotency record, by slot.
#[derive(Debug)]
pub(super) struct KeyStore {
    records: HashMap<Box<str>, IdempotencyRecord>,
    /// At this many records the next insert sweeps out the expired ones. Doubling it after each
    /// sweep keeps the sweeps' cost constant per insert however many records there are.
    sweep_at: usize,
}

/// Below this many records, expired ones are only dropped when their key comes back.
const FIRST_SWEEP_AT: usize = 1024;

impl Default for KeyStore {
    fn default() -> Self {
        Self { records: HashMap::new(), sweep_at: FIRST_SWEEP_AT }
    }
}

impl KeyStore {
    /// The live record of `slot`; an expired one is forgotten on the way.
    fn find(&mut self, slot: &str, now_ms: u64, ttl_ms: u64) -> Found<'_> {
        let expired = match self.records.get(slot) {
            None => return Found::Nothing,
            Some(record) => record.is_expired(now_ms, ttl_ms),
        };
        if expired {
            self.records.remove(slot);
            return Found::Expired;
        }
        self.records.get(slot).map_or(Found::Nothing, Found::Record)
    }

    /// Keeps `record` for `slot`; returns how many expired records a sweep forgot on the way.
    fn keep(&mut self, slot: Box<str>, record: IdempotencyRecord, ttl_ms: u64) -> u64 {
        let now_ms = record.stored_at_ms;
        self.records.insert(slot, record);
        if self.records.len() < self.sweep_at {
            return 0;
        }
        let before = self.records.len();
        self.records.retain(|_, record| !record.is_expired(now_ms, ttl_ms));
        let after = self.records.len();
        self.sweep_at = (after * 2).max(FIRST_SWEEP_AT);
        u64::try_from(before - after).unwrap_or(u64::MAX)
    }

    /// How many records it holds, expired ones not yet swept out included.
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Forgets every record of `api_key`'s keys; returns how many there were.
    pub(super) fn forget_account(&mut self, api_key: &str) -> usize {
        let before = self.records.len();
        self.records.retain(|slot, _| {
            !slot.strip_prefix(api_key).is_some_and(|rest| rest.starts_with('\n'))
        });
        before - self.records.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn record(stored_at_ms: u64) -> IdempotencyRecord {
        IdempotencyRecord {
            request: "/v1/charges?".into(),
            body: "{}".into(),
            stored_at_ms,
            status: StatusCode::OK,
        }
    }

    #[test]
    fn a_record_lives_exactly_its_lifetime() {
        let mut store = KeyStore::default();
        store.keep(slot("sk", "k"), record(100), 1000);
        assert!(matches!(store.find("sk\nk", 1099, 1000), Found::Record(_)));
        assert!(matches!(store.find("sk\nk", 1100, 1000), Found::Expired));
        assert!(matches!(store.find("sk\nk", 1100, 1000), Found::Nothing), "it is forgotten");
    }

    #[test]
    fn forgetting_an_account_forgets_only_its_keys() {
        let mut store = KeyStore::default();
        store.keep(slot("sk_a", "k1"), record(0), 10);
        store.keep(slot("sk_a", "k2"), record(0), 10);
        store.keep(slot("sk_ab", "k1"), record(0), 10);
        store.keep(slot("sk_b", "k1"), record(0), 10);
        assert_eq!(store.forget_account("sk_a"), 2);
        assert_eq!(store.len(), 2);
        assert!(matches!(store.find("sk_ab\nk1", 0, 10), Found::Record(_)), "a longer key stays");
        assert!(matches!(store.find("sk_a\nk1", 0, 10), Found::Nothing));
    }

    #[test]
    fn a_growing_store_sweeps_out_expired_records() {
        let mut store = KeyStore::default();
        for n in 0..FIRST_SWEEP_AT - 1 {
            assert_eq!(store.keep(slot("sk", &n.to_string()), record(0), 10), 0);
        }
        let swept = store.keep(slot("sk", "new"), record(10), 10);
        assert_eq!(swept, u64::try_from(FIRST_SWEEP_AT - 1).unwrap());
        assert_eq!(store.records.len(), 1);
        assert!(matches!(store.find("sk\nnew", 10, 10), Found::Record(_)));
    }
}
