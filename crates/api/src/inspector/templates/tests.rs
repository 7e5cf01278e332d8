//! Tests of the pages: an audit record's detail as pairs, stored text escaped wherever it is
//! shown, and what became of a payment that waited on its customer.

use payments_domain::audit::AuditLine;

use super::key_page::{after_the_key, describe};
use super::*;

fn line(action: &str, detail: serde_json::Value) -> AuditLine {
    AuditLine {
        action: action.into(),
        object_id: "pay_1".into(),
        detail,
        at: "2026-12-05 15:00:00.000".into(),
    }
}

#[test]
fn a_payment_that_waited_on_its_customer_shows_its_outcome_once_recorded() {
    let created = line("payment.created", serde_json::json!({}));
    let charged = line("payment.charged", serde_json::json!({"status": "succeeded"}));
    assert!(after_the_key(&[created.clone(), charged]).is_none(), "an authorized payment");
    let waited = line("payment.requires_action", serde_json::json!({"payment_intent": "pi_1"}));
    let waiting = after_the_key(&[created.clone(), waited.clone()]).unwrap().into_string();
    assert!(waiting.contains("<code>pay_1</code> in <code>requires_action</code>"), "{waiting}");
    assert!(waiting.contains("No outcome yet"), "{waiting}");
    let detail =
        serde_json::json!({"payment_intent": "pi_1", "status": "succeeded", "found_by": "webhook"});
    let settled = line("payment.settled", detail);
    let shown = after_the_key(&[created, waited, settled]).unwrap().into_string();
    assert!(
        shown.contains("Its outcome, <code>succeeded</code>, was recorded at 2026-12-05 15:00:00.000 by the processor's webhook."),
        "{shown}"
    );
    assert!(!shown.contains("No outcome yet"), "{shown}");
}

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
