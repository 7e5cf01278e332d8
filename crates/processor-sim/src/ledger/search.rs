//! Stripe's search for charges (`GET /v1/charges/search`, and the same for PaymentIntents), the
//! part of its query language the stand-in understands: `metadata['key']:'value'` clauses joined
//! by `AND`, answered from an index by metadata so that a search does not walk every object, and
//! blind to objects younger than the search lag, as Stripe's search trails its writes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Value, json};

use super::lists::page_size;
use super::{ChargeRecord, Ledger};
use crate::answer::Answer;

/// Stripe accepts at most this many clauses in one query.
const MAX_CLAUSES: usize = 10;

/// One `metadata['key']:'value'` clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Clause {
    pub key: String,
    pub value: String,
}

/// Parses a search query; the error is the message of a `400 invalid_request_error`.
fn parse(query: &str) -> Result<Vec<Clause>, String> {
    let mut rest = query.trim();
    if rest.is_empty() {
        return Err("The search query is empty.".into());
    }
    let mut clauses = Vec::new();
    loop {
        let (clause, after) = clause(rest)?;
        clauses.push(clause);
        let after = after.trim_start();
        if after.is_empty() {
            break;
        }
        match after.strip_prefix("AND") {
            Some(next) if next.starts_with(char::is_whitespace) => rest = next.trim_start(),
            _ => return Err(unsupported(after)),
        }
    }
    if clauses.len() > MAX_CLAUSES {
        return Err(format!("A search query can have at most {MAX_CLAUSES} clauses."));
    }
    Ok(clauses)
}

fn unsupported(at: &str) -> String {
    let at: String = at.chars().take(40).collect();
    format!(
        "This stand-in's search understands only metadata['key']:'value' clauses joined by AND; \
         it cannot read the query from `{at}`."
    )
}

fn clause(text: &str) -> Result<(Clause, &str), String> {
    let inner = text.strip_prefix("metadata[").ok_or_else(|| unsupported(text))?;
    let (key, after_key) = quoted(inner).ok_or_else(|| unsupported(text))?;
    let after_colon = after_key.strip_prefix("]:").ok_or_else(|| unsupported(after_key))?;
    let (value, rest) = quoted(after_colon).ok_or_else(|| unsupported(after_colon))?;
    if key.is_empty() {
        return Err("A metadata key in a search query cannot be empty.".into());
    }
    Ok((Clause { key, value }, rest))
}

/// A string in single or double quotes, where a backslash escapes the next character; returns it
/// unquoted and the text after it.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut chars = text.char_indices();
    let (_, quote) = chars.next().filter(|(_, c)| *c == '\'' || *c == '"')?;
    let mut value = String::new();
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?.1),
            c if c == quote => return Some((value, &text[at + c.len_utf8()..])),
            c => value.push(c),
        }
    }
    None
}

/// The charges holding each (metadata key, value) pair, oldest first, by a hash of the pair: a
/// hash rather than the strings keeps the index small (the charges hold the strings already),
/// and a collision only adds a candidate that the caller's check of the metadata drops.
#[derive(Debug, Default)]
pub(super) struct MetadataIndex {
    postings: HashMap<u64, Postings>,
}

/// The positions of the charges of one pair; nearly every pair (a payment id) has one.
#[derive(Debug)]
enum Postings {
    One(usize),
    Many(Vec<usize>),
}

fn pair_hash(key: &str, value: &str) -> u64 {
    // `DefaultHasher::new()` has fixed keys, so the same pair always lands in the same place.
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    value.hash(&mut hasher);
    hasher.finish()
}

impl MetadataIndex {
    /// Records that the charge at `position` holds `key: value`. Positions only grow.
    pub(super) fn add(&mut self, key: &str, value: &str, position: usize) {
        match self.postings.entry(pair_hash(key, value)) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Postings::One(position));
            }
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                let postings = slot.get_mut();
                match postings {
                    Postings::One(first) => *postings = Postings::Many(vec![*first, position]),
                    Postings::Many(all) => all.push(position),
                }
            }
        }
    }

    /// The positions of the charges that may hold `key: value`, oldest first.
    pub(super) fn candidates(&self, key: &str, value: &str) -> &[usize] {
        match self.postings.get(&pair_hash(key, value)) {
            None => &[],
            Some(Postings::One(position)) => std::slice::from_ref(position),
            Some(Postings::Many(all)) => all,
        }
    }
}

/// The opaque cursor of the page that starts below `bound` (a charge position).
fn page_token(bound: usize) -> String {
    format!("page_{bound:x}")
}

/// Reads a cursor that [`page_token`] wrote.
fn read_page_token(token: &str) -> Option<usize> {
    usize::from_str_radix(token.strip_prefix("page_")?, 16).ok()
}

impl ChargeRecord {
    fn holds(&self, clause: &Clause) -> bool {
        self.metadata.get(&clause.key) == Some(&clause.value)
    }
}

/// One search over objects indexed by metadata (charges, PaymentIntents): what is searched, and
/// how each object is judged and shown.
pub(super) struct Searched<'a, T> {
    /// The objects, oldest first, at the positions the index holds.
    pub records: &'a [T],
    pub index: &'a MetadataIndex,
    /// Whether an object holds one clause.
    pub holds: fn(&T, &Clause) -> bool,
    /// When an object was made, on the stand-in's clock.
    pub created_ms: fn(&T) -> u64,
    pub to_json: fn(&T) -> Value,
    /// The search's path, for the answer's `url`.
    pub url: &'static str,
}

/// A search's request: the query, the page size, the cursor, and what search cannot see yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct SearchRequest<'a> {
    pub query: Option<&'a str>,
    pub limit: Option<usize>,
    pub page: Option<&'a str>,
    /// The stand-in's time now.
    pub now_ms: u64,
    /// Objects younger than this are not seen yet.
    pub search_lag_ms: u64,
}

/// The objects whose metadata hold every clause of the query, newest first, leaving out those
/// younger than the lag; `page` is a cursor this answered. Stripe's `search_result`.
pub(super) fn search<T>(searched: &Searched<'_, T>, request: SearchRequest<'_>) -> Answer {
    let Some(query) = request.query else {
        return Answer::bad_param(
            "parameter_missing",
            Some("query"),
            "Missing required param: query.",
        );
    };
    let clauses = match parse(query) {
        Ok(clauses) => clauses,
        Err(message) => return Answer::bad_param("parameter_invalid", Some("query"), &message),
    };
    let below = match request.page {
        None => usize::MAX,
        Some(token) => match read_page_token(token) {
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
        .map(|clause| searched.index.candidates(&clause.key, &clause.value))
        .min_by_key(|candidates| candidates.len())
        .unwrap_or_default();
    let mut matches =
        candidates.iter().rev().filter(|&&position| position < below).filter_map(|&position| {
            let record = searched.records.get(position)?;
            let age_ms = request.now_ms.saturating_sub((searched.created_ms)(record));
            let visible = age_ms >= request.search_lag_ms;
            (visible && clauses.iter().all(|clause| (searched.holds)(record, clause)))
                .then_some((position, record))
        });
    let limit = page_size(request.limit);
    let found: Vec<(usize, &T)> = matches.by_ref().take(limit).collect();
    let has_more = matches.next().is_some();
    let next_page = match found.last() {
        Some(&(position, _)) if has_more => Some(page_token(position)),
        _ => None,
    };
    let data: Vec<Value> = found.iter().map(|(_, record)| (searched.to_json)(record)).collect();
    Answer::ok(json!({
        "object": "search_result", "data": data, "has_more": has_more,
        "next_page": next_page, "url": searched.url,
    }))
}

impl Ledger {
    /// The charges whose metadata hold every clause of `query`, newest first, leaving out those
    /// younger than `search_lag_ms`; `page` is a cursor this answered.
    pub(crate) fn search_charges(
        &mut self,
        query: Option<&str>,
        limit: Option<usize>,
        page: Option<&str>,
        search_lag_ms: u64,
    ) -> Answer {
        self.stats.searches += 1;
        let searched = Searched {
            records: &self.charges,
            index: &self.metadata_index,
            holds: ChargeRecord::holds,
            created_ms: |charge| charge.created_ms,
            to_json: ChargeRecord::to_json,
            url: "/v1/charges/search",
        };
        let now_ms = self.clock.now_ms();
        search(&searched, SearchRequest { query, limit, page, now_ms, search_lag_ms })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn clause(key: &str, value: &str) -> Clause {
        Clause { key: key.into(), value: value.into() }
    }

    #[test]
    fn metadata_clauses_joined_by_and_are_understood() {
        assert_eq!(
            parse("metadata['payment_id']:'pay_1'").unwrap(),
            vec![clause("payment_id", "pay_1")]
        );
        assert_eq!(
            parse(r#" metadata["a"]:"x y"  AND metadata['b']:'it\'s' "#).unwrap(),
            vec![clause("a", "x y"), clause("b", "it's")]
        );
    }

    #[test]
    fn anything_else_is_refused_with_a_message() {
        for query in [
            "",
            "amount>1000",
            "status:'succeeded'",
            "metadata['a']:'x' OR metadata['b']:'y'",
            "metadata['a']:'x' ANDmetadata['b']:'y'",
            "metadata['a']:'x",
            "metadata['a'] : 'x'",
            "-metadata['a']:'x'",
            "metadata['']:'x'",
        ] {
            assert!(parse(query).is_err(), "{query}");
        }
        let eleven = ["metadata['a']:'x'"; 11].join(" AND ");
        assert!(parse(&eleven).is_err());
    }

    #[test]
    fn the_index_finds_every_charge_of_a_pair_oldest_first() {
        let mut index = MetadataIndex::default();
        index.add("payment_id", "pay_1", 0);
        index.add("payment_id", "pay_2", 1);
        index.add("payment_id", "pay_1", 2);
        index.add("payment_id", "pay_1", 5);
        assert_eq!(index.candidates("payment_id", "pay_1"), &[0, 2, 5]);
        assert_eq!(index.candidates("payment_id", "pay_2"), &[1]);
        assert!(index.candidates("payment_id", "pay_3").is_empty());
    }

    #[test]
    fn a_page_token_reads_back() {
        assert_eq!(read_page_token(&page_token(12345)), Some(12345));
        assert_eq!(read_page_token("bogus"), None);
    }
}
