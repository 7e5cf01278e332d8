//! `GET /inspector`: recent keys per account, keys waiting for a person, jobs staged or dead,
//! webhook deliveries and receipts.

use idem::inspect::{KeyLists, KeySummary};
use maud::{Markup, html};
use payments_domain::Account;
use payments_domain::jobs::PendingJob;
use payments_domain::receipts::{NotSentReason, ReceiptLine};
use payments_domain::webhooks::{DeliveryLine, Outcome};

use super::{age, page, short};

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
                th { "sent (UTC), or why not" }
            }
            @for receipt in receipts {
                tr {
                    td { code { (receipt.payment_id) } } td { code { (receipt.account_id) } }
                    td { (receipt.email) } td { (receipt.created) }
                    td { (receipt_status(receipt)) }
                }
            }
        }
    }
}

/// When a receipt was sent, or why it was not: withheld for good, or not yet (a send to come, or
/// retried; with no SMTP server configured a receipt counts as sent once logged).
fn receipt_status(receipt: &ReceiptLine) -> &str {
    match (&receipt.sent, receipt.not_sent_reason) {
        (Some(sent), _) => sent,
        (None, Some(NotSentReason::UnverifiedRecipient)) => {
            "not sent: test mode, and not an address the account verified"
        }
        (None, Some(NotSentReason::QuotaExceeded)) => "not sent: the account's hourly quota",
        (None, None) => "not yet",
    }
}
