//! Tests of the pages: an audit record's detail as pairs, and stored text escaped wherever it is
//! shown.

use super::key_page::describe;
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
