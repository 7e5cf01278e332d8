//! `GET /inspector/keys/{id}`: one key's facts, its state diagram and legend beside its timeline,
//! its stored answer, and, for a new payment that waited on its customer, what became of it after
//! the key was finished.

use idem::inspect::{AttemptRecord, KeyDetail};
use maud::{Markup, html};
use payments_domain::audit::AuditLine;
use serde_json::Value;

use super::{page, short};
use crate::inspector::body;
use crate::inspector::diagram::{self, KeyPath, Now, REQUIRES_ACTION, SETTLED};
use crate::inspector::legend::legend;

/// What one key's page shows.
#[derive(Debug)]
pub struct KeyPage<'a> {
    /// The key.
    pub key: &'a KeyDetail,
    /// Its account's name.
    pub account_name: &'a str,
    /// Its attempts after the claim.
    pub attempts: &'a [AttemptRecord],
    /// The audit records written under it.
    pub events: &'a [AuditLine],
    /// `inspector.docs_base_url`: where the legend's links point.
    pub docs_base_url: &'a str,
}

/// `GET /inspector/keys/{id}`
pub fn key_page(p: &KeyPage<'_>) -> Markup {
    let key = p.key;
    let in_flight = !key.finished && !key.flagged;
    let until = key.lease_until.as_deref().unwrap_or("");
    let lease = html! {
        @match (&key.owner_token, key.lease_active) {
            (Some(token), true) => { "held by " code { (short(token)) } " until " (until) }
            (Some(token), false) => { "expired (was " code { (short(token)) } ")" }
            (None, _) => { "free" }
        }
    };
    let path = key_path(p);
    let next_attempt = if in_flight { key.next_attempt.as_deref().unwrap_or("—") } else { "—" };
    let facts: [(&str, Markup); 8] = [
        ("account", html! { (p.account_name) " " code { (key.account_id) } }),
        (
            "request",
            html! { (key.request_method) " " code { (key.request_path) } " (" (key.operation) ")" },
        ),
        ("recovery point", html! { code #recovery-point { (key.recovery_point) } }),
        ("lease", lease),
        ("attempts", html! { (key.attempts) }),
        ("created (UTC)", html! { (key.created) }),
        ("next completer attempt (UTC)", html! { (next_attempt) }),
        ("last error", html! { (key.last_error.as_deref().unwrap_or("—")) }),
    ];
    let body = html! {
        p { a href="/inspector" { "← all keys" } }
        h1 { "Key " code { (key.idempotency_key) } }
        @if in_flight { p.note { "In flight: this page refreshes itself." } }
        table.facts { @for (name, value) in &facts { tr { th { (name) } td { (value) } } } }
        div.beside {
            div {
                h2 { "Where it stands" }
                (diagram::state_diagram(&path))
                (legend(p.docs_base_url, &key.operation, path.now))
            }
            div {
                h2 { "Timeline" }
                ol.timeline {
                    @for (at, _, what, detail) in timeline(p) {
                        li { time { (at) } " " strong { (what) } " " span { (detail) } }
                    }
                }
            }
        }
        @if let (Some(status), Some(body)) = (key.response_status, &key.response_body) {
            h2 { "Stored answer: " (status) }
            pre #stored-answer { (body::shown_body(body)) }
        }
        @if let Some(after) = after_the_key(p.events) { (after) }
    };
    page(&format!("Key {}", key.idempotency_key), in_flight, body)
}

/// What the state diagram is drawn from.
fn key_path<'a>(p: &KeyPage<'a>) -> KeyPath<'a> {
    let key = p.key;
    let now = match (key.finished, key.flagged, key.owner_token.is_some(), key.lease_active) {
        (true, _, _, _) => Now::Finished,
        (false, true, _, _) => Now::Flagged,
        (false, false, true, true) => Now::LeaseHeld,
        (false, false, true, false) => Now::LeaseExpired,
        (false, false, false, _) => Now::LeaseFree,
    };
    KeyPath {
        operation: &key.operation,
        recovery_point: &key.recovery_point,
        now,
        resumed_from: p.attempts.iter().map(|a| a.recovery_point.as_str()).collect(),
        actions: p.events.iter().map(|e| e.action.as_str()).collect(),
    }
}

/// The key's history in order: (when, order among equals, what, detail).
fn timeline(p: &KeyPage<'_>) -> Vec<(String, u8, Markup, Markup)> {
    let key = p.key;
    let mut timeline = vec![(
        key.created.clone(),
        0,
        html! { "claimed (attempt 1)" },
        html! { "by request " code { (key.request_id) } "; recovery point " code { "started" } },
    )];
    for attempt in p.attempts {
        let how = if attempt.took_over {
            "took over from a holder whose lease had expired"
        } else {
            "resumed a key released after a transient failure"
        };
        timeline.push((
            attempt.at.clone(),
            1,
            html! { "attempt " (attempt.attempt) },
            html! {
                @if let Some(request) = &attempt.request_id { "request " code { (request) } }
                @else { "the completer (payments-worker)" }
                " " (how) ", from " code { (attempt.recovery_point) }
            },
        ));
    }
    for event in p.events {
        timeline.push((
            event.at.clone(),
            2,
            html! { (event.action) },
            html! { code { (event.object_id) } " " (describe(&event.detail)) },
        ));
    }
    if let (Some(at), Some(status)) = (&key.completed, key.response_status) {
        let what = html! { "answer stored: " (status) };
        timeline.push((at.clone(), 3, what, html! { "replayed to every retry" }));
    }
    if let Some(at) = &key.flagged_at {
        timeline.push((
            at.clone(),
            3,
            html! { span.bad { "flagged for a person" } },
            html! { (key.last_error.as_deref().unwrap_or("")) },
        ));
    }
    timeline.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    timeline
}

/// What became of a new payment that waited on its customer (`requires_action`) after its key was
/// finished, from the audit records written under the key; `None` for any other key.
pub(super) fn after_the_key(events: &[AuditLine]) -> Option<Markup> {
    let waited = events.iter().find(|e| e.action == REQUIRES_ACTION)?;
    let settled = events.iter().find(|e| e.action == SETTLED);
    let member = |line: &AuditLine, name: &str| {
        line.detail.get(name).and_then(Value::as_str).unwrap_or("unknown").to_owned()
    };
    Some(html! {
        section #after-the-key {
            h2 { "The payment after the key" }
            p {
                "The answer stored for this key is the payment " code { (waited.object_id) }
                " in " code { "requires_action" } ": its customer had to authenticate (3-D \
                Secure). A retry with this key replays that answer; " code { "GET" }
                " shows the payment as it is now."
            }
            @match settled {
                Some(line) => p #outcome {
                    "Its outcome, " code { (member(line, "status")) } ", was recorded at "
                    (line.at) " by "
                    @match member(line, "found_by").as_str() {
                        "webhook" => { "the processor's webhook" }
                        "job" => { "the worker's authentication job" }
                        other => { code { (other) } }
                    }
                    "."
                },
                None => p #outcome {
                    "No outcome yet: the processor's webhook, or the worker's authentication job \
                     (which asks the processor, and cancels the payment once its authentication \
                     expires), records it."
                },
            }
        }
    })
}

/// An audit record's detail as `name: value` pairs.
pub(super) fn describe(detail: &Value) -> Markup {
    let members = detail.as_object().into_iter().flatten();
    html! {
        @for (i, (name, value)) in members.enumerate() {
            @if i > 0 { ", " }
            (if name == "downstream_key" { "processor key" } else { name.as_str() }) ": "
            code { @if let Value::String(s) = value { (s) } @else { (value.to_string()) } }
        }
    }
}
