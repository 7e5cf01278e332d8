//! Charges as Stripe and compatible servers send them.

use super::*;

/// A declined charge as Stripe sends it (`pm_card_chargeDeclinedInsufficientFunds`).
fn declined_charge() -> serde_json::Value {
    serde_json::json!({
        "id": "ch_1", "object": "charge", "amount": 500, "currency": "usd",
        "captured": false, "paid": false, "status": "failed", "amount_captured": 0,
        "amount_refunded": 0, "refunded": false, "failure_code": "card_declined",
        "failure_message": "Your card has insufficient funds.",
        "outcome": {"network_status": "declined_by_network", "reason": "insufficient_funds",
                    "risk_level": "normal", "risk_score": 12,
                    "seller_message": "The bank returned the decline code `insufficient_funds`.",
                    "type": "issuer_declined"},
        "metadata": {"payment_id": "pay_1"},
    })
}

#[test]
fn a_declined_charge_is_declined_for_its_outcomes_reason_not_its_failure_code() {
    let charge: Charge = serde_json::from_value(declined_charge()).unwrap();
    assert_eq!(charge.failure_code.as_deref(), Some("card_declined"));
    assert_eq!(charge.failure_message.as_deref(), Some("Your card has insufficient funds."));
    let outcome = charge.outcome.as_ref().unwrap();
    assert_eq!(outcome.type_.as_deref(), Some("issuer_declined"));
    assert_eq!(outcome.network_status.as_deref(), Some("declined_by_network"));
    assert_eq!(charge.decline_code(), "insufficient_funds");
}

#[test]
fn without_an_outcome_the_failure_code_stands_in_and_without_a_reason_the_decline_is_generic() {
    let mut bare = declined_charge();
    bare.as_object_mut().unwrap().remove("outcome");
    let charge: Charge = serde_json::from_value(bare).unwrap();
    assert_eq!(charge.decline_code(), "card_declined");

    let mut no_reason = declined_charge();
    no_reason["outcome"]["reason"] = serde_json::Value::Null;
    let charge: Charge = serde_json::from_value(no_reason).unwrap();
    assert_eq!(charge.decline_code(), "generic_decline");

    let mut nothing = declined_charge();
    nothing["outcome"] = serde_json::Value::Null;
    nothing["failure_code"] = serde_json::Value::Null;
    let charge: Charge = serde_json::from_value(nothing).unwrap();
    assert_eq!(charge.decline_code(), "generic_decline");
}

#[test]
fn a_charge_blocked_by_risk_rules_is_not_declined_for_the_rule_it_names() {
    let mut blocked = declined_charge();
    blocked["outcome"]["type"] = "blocked".into();
    blocked["outcome"]["reason"] = "highest_risk_level".into();
    let charge: Charge = serde_json::from_value(blocked).unwrap();
    assert_eq!(charge.decline_code(), "card_declined");
}

#[test]
fn a_successful_charges_outcome_has_no_reason() {
    let success = serde_json::json!({
        "id": "ch_2", "object": "charge", "amount": 500, "currency": "usd", "captured": true,
        "paid": true, "status": "succeeded", "amount_captured": 500, "amount_refunded": 0,
        "refunded": false, "failure_code": null, "failure_message": null,
        "outcome": {"network_status": "approved_by_network", "reason": null,
                    "risk_level": "normal", "seller_message": "Payment complete.",
                    "type": "authorized"},
    });
    let charge: Charge = serde_json::from_value(success).unwrap();
    let outcome = charge.outcome.unwrap();
    assert_eq!((outcome.type_.as_deref(), outcome.reason), (Some("authorized"), None));
}

/// A charge from a server that sends only its identity and some of its state.
fn sparse(extra: serde_json::Value) -> Charge {
    let mut charge = serde_json::json!({"id": "ch_s", "amount": 500, "currency": "usd"});
    for (name, value) in extra.as_object().unwrap() {
        charge[name] = value.clone();
    }
    serde_json::from_value(charge).unwrap()
}

#[test]
fn a_captured_charge_without_amount_captured_was_captured_in_full() {
    let charge = sparse(serde_json::json!({"paid": true, "status": "succeeded", "captured": true}));
    assert_eq!((charge.captured, charge.amount_captured), (true, 500));
    assert_eq!((charge.amount_refunded, charge.refunded), (0, false));
    assert!(charge.is_decided());
    assert!(charge.metadata.is_empty());
}

#[test]
fn an_authorization_without_its_amounts_captured_nothing() {
    let charge =
        sparse(serde_json::json!({"paid": true, "status": "succeeded", "captured": false}));
    assert_eq!((charge.captured, charge.amount_captured), (false, 0));
}

#[test]
fn a_charge_that_does_not_say_it_was_captured_is_read_as_not_captured_unless_an_amount_says_so() {
    let silent = sparse(serde_json::json!({"paid": true, "status": "succeeded"}));
    assert_eq!((silent.captured, silent.amount_captured), (false, 0));
    let by_amount = sparse(serde_json::json!({"paid": true, "amount_captured": 300}));
    assert_eq!((by_amount.captured, by_amount.amount_captured), (true, 300));
}

#[test]
fn paid_and_status_stand_in_for_each_other_and_neither_is_undecided() {
    let by_status = sparse(serde_json::json!({"status": "succeeded"}));
    assert!(by_status.paid);
    let by_paid = sparse(serde_json::json!({"paid": true}));
    assert_eq!(by_paid.status, "succeeded");
    let failed = sparse(serde_json::json!({"paid": false, "failure_code": "card_declined"}));
    assert_eq!((failed.status.as_str(), failed.is_decided()), ("failed", true));
    let neither = sparse(serde_json::json!({}));
    assert_eq!((neither.paid, neither.status.as_str()), (false, "pending"));
    assert!(!neither.is_decided(), "nothing said is no outcome: look it up again");
}

#[test]
fn refunded_and_amount_refunded_stand_in_for_each_other() {
    let whole = sparse(serde_json::json!({"paid": true, "refunded": true}));
    assert_eq!(whole.amount_refunded, 500);
    let part = sparse(serde_json::json!({"paid": true, "amount_refunded": 200}));
    assert!(!part.refunded);
    let all = sparse(serde_json::json!({"paid": true, "amount_refunded": 500}));
    assert!(all.refunded);
}

#[test]
fn a_charge_read_back_from_its_stored_form_is_the_same_charge() {
    let charge = sparse(serde_json::json!({"paid": true, "captured": true, "metadata": null}));
    let stored = serde_json::to_value(&charge).unwrap();
    assert_eq!(serde_json::from_value::<Charge>(stored).unwrap(), charge);
}
