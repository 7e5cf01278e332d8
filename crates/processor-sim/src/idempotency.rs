//! The stand-in's idempotency records: one per key, compact (a run holds hundreds of thousands),
//! each with its age so that a key is forgotten after its lifetime, as at Stripe.

use std::collections::HashMap;

use axum::http::StatusCode;

/// What is kept per idempotency key.
#[derive(Debug)]
pub(super) struct IdempotencyRecord {
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
pub(super) fn request_line(path: &str, sorted: &[(String, String)]) -> Box<str> {
    let escape = |s: &str| s.replace('%', "%25").replace('&', "%26").replace('=', "%3D");
    let params: Vec<String> =
        sorted.iter().map(|(k, v)| format!("{}={}", escape(k), escape(v))).collect();
    format!("{path}?{}", params.join("&")).into_boxed_str()
}

/// The slot of a key: keys belong to the API key that sent them. One string rather than a pair
/// saves an allocation per record; a header value cannot hold the `\n` between them.
pub(super) fn slot(api_key: &str, key: &str) -> Box<str> {
    format!("{api_key}\n{key}").into_boxed_str()
}

/// What a lookup found.
#[derive(Debug)]
pub(super) enum Found<'a> {
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
    pub(super) fn find(&mut self, slot: &str, now_ms: u64, ttl_ms: u64) -> Found<'_> {
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
    pub(super) fn keep(&mut self, slot: Box<str>, record: IdempotencyRecord, ttl_ms: u64) -> u64 {
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
