//! The inspector's pages as `maud` templates: every value is escaped by construction, and the
//! only markup that is not is the style sheet below.

use super::body;
use super::diagram::{self, KeyPath, Now};
use super::legend::legend;
use idem::inspect::{AttemptRecord, KeyDetail, KeyLists, KeySummary};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use payments_domain::Account;
use payments_domain::audit::AuditLine;
use payments_domain::jobs::PendingJob;
use payments_domain::receipts::ReceiptLine;
use payments_domain::webhooks::{DeliveryLine, Outcome};
use serde_json::Value;
use uuid::Uuid;

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:72em;\
padding:0 1em;color:#1d232b}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}\
table{border-collapse:collapse;width:100%;margin:.5em 0}th,td{text-align:left;padding:.3em .5em;\
border-bottom:1px solid #e3e6ea;vertical-align:top}th{background:#f5f7f9;font-weight:600}\
code{font:12px ui-monospace,monospace;background:#f1f3f5;padding:0 .2em;border-radius:3px}\
.bad{color:#b3261e;font-weight:600}.live{color:#0b6bcb;font-weight:600}.note{color:#0b6bcb}\
ol.timeline{list-style:none;padding:0}ol.timeline li{padding:.35em 0;border-bottom:1px solid #eef0f2}\
time{font:12px ui-monospace,monospace;color:#5b6570;margin-right:.6em}\
pre{background:#f5f7f9;padding:.8em;overflow:auto;white-space:pre-wrap;word-break:break-all}\
table.facts th{width:14em}.beside{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}\
.beside>div{flex:1 1 30em;min-width:0}svg{max-width:100%;height:auto}#legend ul{padding-left:1.2em}";

/// A whole page; `refresh` reloads it every two seconds (while a key is in flight).
fn page(title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if refresh { meta http-equiv="refresh" content="2"; }
                meta name="viewport" content="width=device-width,initial-scale=1";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body { (body) }
        }
    }
}

/// The 401 page: a form that asks for the token.
pub fn login(wrong: bool) -> Markup {
    page(
        "Inspector: operator token required",
        false,
        html! {
            h1 { "Operator token required" }
            @if wrong { p.bad { "That token is not the operator token." } }
            p {
                "This page shows the server's idempotency keys. Enter the operator token ("
                code { "inspector.token" } "; " code { "make run" } " prints it)."
            }
            form method="get" {
                input type="password" name="token" autocomplete="off" aria-label="operator token";
                " " button type="submit" { "Open" }
            }
        },
    )
}

/// The 404 page.
pub fn not_found() -> Markup {
    page(
        "Inspector: no such key",
        false,
        html! { p { a href="/inspector" { "← all keys" } } h1 { "No such key" } },
    )
}

/// The 503 page.
pub fn unavailable() -> Markup {
    page(
        "Inspector: database unavailable",
        false,
        html! { h1 { "The database did not answer" } p { "Reload in a moment." } },
    )
}

/// What the overview shows.
#[derive(Debug)]
pub struct Overview<'a> {
    /// The accounts whose keys are listed, in the order they are shown.
    pub accounts: &'a [Account],
    /// Their recent keys, and the keys waiting for a person.
    pub keys: &'a KeyLists,
    /// Jobs staged or dead.
    pub jobs: &'a [PendingJob],
    /// The newest webhook delivery attempts.
    pub deliveries: &'a [DeliveryLine],
    /// The newest receipts.
    pub receipts: &'a [ReceiptLine],
}

/// `GET /inspector`
pub fn overview(o: &Overview<'_>) -> Markup {
    let in_flight = o.keys.recent.iter().any(KeySummary::in_flight);
    let body = html! {
        h1 { "Idempotency keys" }
        @if in_flight { p.note { "A key is in flight: this page refreshes itself." } }
        h2 { "Waiting for a person" }
        @if o.keys.flagged.is_empty() { p { "None." } } @else { (key_table(&o.keys.flagged, true)) }
        h2 { "Recent keys by account" }
        @if o.keys.recent.is_empty() { p { "No keys yet." } }
        @for account in o.accounts {
            @let theirs: Vec<&KeySummary> =
                o.keys.recent.iter().filter(|k| k.account_id == account.id.as_str()).collect();
            @if !theirs.is_empty() {
                h3 { (account.name) " " code { (account.id.as_str()) } }
                (key_table(theirs.iter().copied(), false))
            }
        }
        h2 { "Jobs staged or dead" }
        @if o.jobs.is_empty() { p { "None: every staged job has run." } } @else { (jobs(o.jobs)) }
        h2 { "Webhook deliveries" }
        @if o.deliveries.is_empty() { p { "None yet." } } @else { (deliveries(o.deliveries)) }
        h2 { "Receipts" }
        @if o.receipts.is_empty() { p { "None yet." } } @else { (receipts(o.receipts)) }
    };
    page("Inspector", in_flight, body)
}

fn key_table<'a>(keys: impl IntoIterator<Item = &'a KeySummary>, with_error: bool) -> Markup {
    html! {
        table.keys {
            tr {
                th { "key" } th { "request" } th { "recovery point" } th { "lease" }
                th { "attempts" } th { "state" } th { "age" }
                @if with_error { th { "why" } }
            }
            @for key in keys {
                tr {
                    td { a href={ "/inspector/keys/" (key.id) } { code { (key.key) } } }
                    td { (key.method) " " code { (key.path) } br; small { (key.operation) } }
                    td { code { (key.recovery_point) } }
                    td { (summary_lease(key)) }
                    td { (key.attempts) }
                    td { (state(key)) }
                    td { (age(key.age_s)) }
                    @if with_error { td { (key.last_error.as_deref().unwrap_or("")) } }
                }
            }
        }
    }
}

fn summary_lease(key: &KeySummary) -> Markup {
    let until = key.lease_until.as_deref().unwrap_or("");
    html! {
        @match (&key.owner_token, key.lease_active) {
            (Some(token), true) => { "held by " code { (short(token)) } " until " (until) }
            (Some(token), false) => {
                span.bad { "expired" } " (" code { (short(token)) } ", " (until) ")"
            }
            (None, _) => { "free" }
        }
    }
}

fn state(key: &KeySummary) -> Markup {
    html! {
        @if key.flagged { span.bad { "needs a person" } }
        @else if let Some(status) = key.response_status { "answered " (status) }
        @else { span.live { "in flight" } }
    }
}

fn jobs(jobs: &[PendingJob]) -> Markup {
    html! {
        table {
            tr {
                th { "job" } th { "kind" } th { "for" } th { "state" } th { "attempts" }
                th { "next run (UTC)" } th { "last error" }
            }
            @for job in jobs {
                tr {
                    td { (job.id) } td { (job.kind) } td { code { (job.dedupe_key) } }
                    td { @if job.dead { span.bad { "dead" } } @else { "staged" } }
                    td { (job.attempts) } td { (job.run_at) }
                    td { (job.last_error.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}

fn deliveries(deliveries: &[DeliveryLine]) -> Markup {
    html! {
        table {
            tr {
                th { "at (UTC)" } th { "account" } th { "endpoint" } th { "event" } th { "attempt" }
                th { "answer" } th { "outcome" } th { "ms" } th { "error" }
            }
            @for d in deliveries {
                tr {
                    td { (d.at) } td { code { (d.account_id) } }
                    td { code { (d.endpoint_id) } " " (d.url) } td { code { (d.event_id) } }
                    td { (d.attempt) }
                    td { @if let Some(code) = d.status_code { (code) } @else { "none" } }
                    td { @if d.outcome == Outcome::Dead { span.bad { "dead" } } @else { (d.outcome) } }
                    td { (d.duration_ms) } td { (d.error.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}

fn receipts(receipts: &[ReceiptLine]) -> Markup {
    html! {
        table {
            tr {
                th { "payment" } th { "account" } th { "to" } th { "recorded (UTC)" }
                th { "sent (UTC)" }
            }
            @for receipt in receipts {
                tr {
                    td { code { (receipt.payment_id) } } td { code { (receipt.account_id) } }
                    td { (receipt.email) } td { (receipt.created) }
                    td { (receipt.sent.as_deref().unwrap_or("not sent (no SMTP server)")) }
                }
            }
        }
    }
}

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

/// An audit record's detail as `name: value` pairs.
fn describe(detail: &Value) -> Markup {
    let members = detail.as_object().into_iter().flatten();
    html! {
        @for (i, (name, value)) in members.enumerate() {
            @if i > 0 { ", " }
            (if name == "downstream_key" { "processor key" } else { name.as_str() }) ": "
            code { @if let Value::String(s) = value { (s) } @else { (value.to_string()) } }
        }
    }
}

fn short(token: &Uuid) -> String {
    token.to_string().chars().take(8).collect()
}

fn age(seconds: f64) -> String {
    match seconds {
        s if s < 60.0 => format!("{s:.1} s"),
        s if s < 3600.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.0} d", s / 86_400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_details_read_as_pairs() {
        let detail = serde_json::json!({"charge": "ch_1", "downstream_key": "pay_1/charge"});
        assert_eq!(
            describe(&detail).into_string(),
            "charge: <code>ch_1</code>, processor key: <code>pay_1/charge</code>"
        );
    }

    #[test]
    fn stored_text_is_escaped_wherever_it_is_shown() {
        let hostile = "<script>alert('x')</script>&\"";
        let detail = serde_json::json!({ hostile: hostile });
        let described = describe(&detail).into_string();
        assert!(!described.contains("<script>"), "{described}");
        assert!(described.contains("&lt;script&gt;"), "{described}");
        let title = page(hostile, false, html! { (hostile) }).into_string();
        assert!(!title.contains("<script>") && title.contains("&quot;"), "{title}");
    }
}
