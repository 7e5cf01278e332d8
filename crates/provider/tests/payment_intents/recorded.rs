//! PaymentIntents and refunds as Stripe and compatible servers send them, each read for what the
//! code needs: whether it is decided, what the customer must do, why it failed, whose it is.

use provider::{IntentStatus, PaymentIntent, Refund};
use serde_json::json;

use super::fixture;

fn intent(value: serde_json::Value) -> PaymentIntent {
    serde_json::from_value(value).unwrap_or_else(|err| panic!("{err}"))
}

#[test]
fn a_full_intent_of_a_newer_version_reads_despite_fields_the_code_does_not_know() {
    let read = intent(fixture("payment_intent_full"));
    assert_eq!(read.id, "pi_3QxFull0000000001");
    assert_eq!((read.amount, read.amount_received, read.amount_capturable), (2000, Some(2000), 0));
    assert_eq!(read.currency, "usd");
    assert_eq!(read.status, IntentStatus::Succeeded);
    assert_eq!(read.latest_charge.as_deref(), Some("ch_3QxFull0000000001"));
    assert!(read.is_decided());
    assert!(!read.needs_action());
    assert_eq!((read.action_url(), read.failure_message()), (None, None));
    assert!(read.is_of("pay_123"));
    assert!(!read.is_of("pay_12"));
    assert_eq!(read.metadata["release"], "0042");
}

#[test]
fn a_sparse_intent_reads_with_defaults_as_its_status_means_them() {
    let read = intent(fixture("payment_intent_sparse"));
    assert_eq!(read.status, IntentStatus::RequiresCapture);
    assert_eq!(read.amount_capturable, 500, "awaiting capture: all of it is capturable");
    assert_eq!(read.amount_received, None, "left out: unknown, not 0");
    assert_eq!(
        (&read.latest_charge, &read.next_action, &read.last_payment_error),
        (&None, &None, &None)
    );
    assert!(read.metadata.is_empty());
    assert!(read.is_decided());
    assert!(!read.is_of("pay_123"), "no metadata: no payment's");

    let succeeded = intent(json!({"id": "pi_s", "amount": 500, "currency": "usd",
                                  "status": "succeeded"}));
    // What a partial capture took is its caller's to know, not all of `amount`.
    assert_eq!((succeeded.amount_received, succeeded.amount_capturable), (None, 0));
}

#[test]
fn an_older_shaped_intent_gives_its_newest_charge_as_the_latest() {
    let read = intent(fixture("payment_intent_older_shape"));
    assert_eq!(read.latest_charge.as_deref(), Some("ch_1Gold0000000002"));
    assert_eq!(read.status, IntentStatus::RequiresCapture);
    assert_eq!(read.amount_capturable, 1500, "no amount_capturable: all of an authorization");
    assert_eq!(read.amount_received, Some(0));
    assert!(read.is_of("pay_old"));

    // Before 2019-02-11 the statuses had other names: not known, so not decided.
    let mut oldest = fixture("payment_intent_older_shape");
    oldest["status"] = json!("requires_source_action");
    let read = intent(oldest);
    assert_eq!(read.status, IntentStatus::Unknown);
    assert!(!read.is_decided() && !read.needs_action());
}

#[test]
fn an_expanded_latest_charge_reads_as_its_id() {
    let read = intent(fixture("payment_intent_expanded_charge"));
    assert_eq!(read.latest_charge.as_deref(), Some("ch_3Qexpanded000001"));
    assert_eq!(read.amount_received, Some(500), "a partial capture, as sent");
    assert!(read.is_of("pay_expanded"));
}

#[test]
fn an_intent_that_requires_a_redirect_gives_the_page_to_send_the_customer_to() {
    let read = intent(fixture("payment_intent_requires_action_redirect"));
    assert!(read.needs_action());
    assert!(!read.is_decided());
    assert_eq!(
        read.action_url(),
        Some(
            "https://hooks.stripe.com/3d_secure_2/hosted?merchant=acct_1&payment_intent=pi_3Qredirect000001&publishable_key=pk_test_x&source=src_1"
        )
    );
    let redirect = read.next_action.as_ref().unwrap().redirect_to_url.as_ref().unwrap();
    assert_eq!(
        redirect.return_url.as_deref(),
        Some("https://pay.example.com/v1/payments/pay_3ds/return")
    );
    assert_eq!(read.latest_charge, None);
}

#[test]
fn an_intent_that_requires_stripes_sdk_needs_action_but_has_no_page() {
    let read = intent(fixture("payment_intent_requires_action_sdk"));
    assert!(read.needs_action());
    assert!(!read.is_decided());
    assert_eq!(read.next_action.as_ref().unwrap().type_, "use_stripe_sdk");
    assert_eq!(read.action_url(), None);
}

#[test]
fn the_intent_inside_a_decline_is_decided_and_says_why() {
    let read = intent(fixture("error_402_declined")["error"]["payment_intent"].clone());
    assert_eq!(read.status, IntentStatus::RequiresPaymentMethod);
    assert!(read.is_decided(), "sent back for another card, with a reason: a decline");
    assert_eq!(read.decline_code(), "insufficient_funds");
    assert_eq!(read.failure_message(), Some("Your card has insufficient funds."));
    let error = read.last_payment_error.as_ref().unwrap();
    assert_eq!(
        (error.type_.as_deref(), error.code.as_deref()),
        (Some("card_error"), Some("card_declined"))
    );
}

#[test]
fn a_failed_authentication_is_declined_for_its_code_and_a_bare_error_is_generic() {
    let failed = |error: serde_json::Value| {
        intent(json!({"id": "pi_f", "amount": 500, "currency": "usd",
                      "status": "requires_payment_method", "last_payment_error": error}))
    };
    let authentication = failed(json!({"type": "invalid_request_error",
        "code": "payment_intent_authentication_failure",
        "message": "The provided PaymentMethod has failed authentication."}));
    assert!(authentication.is_decided());
    assert_eq!(authentication.decline_code(), "payment_intent_authentication_failure");
    let bare = failed(json!({}));
    assert_eq!((bare.decline_code().as_str(), bare.failure_message()), ("generic_decline", None));
    let new = intent(json!({"id": "pi_n", "amount": 500, "currency": "usd",
                            "status": "requires_payment_method", "last_payment_error": null}));
    assert!(!new.is_decided(), "a new intent without a payment method is no decline");
}

#[test]
fn every_status_is_decided_or_not_as_the_code_needs() {
    for (status, decided, action) in [
        ("succeeded", true, false),
        ("requires_capture", true, false),
        ("canceled", true, false),
        ("requires_action", false, true),
        ("processing", false, false),
        ("requires_confirmation", false, false),
        ("a_status_of_2030", false, false),
    ] {
        let read = intent(json!({"id": "pi_x", "amount": 1, "currency": "usd", "status": status}));
        assert_eq!((read.is_decided(), read.needs_action()), (decided, action), "{status}");
    }
}

#[test]
fn an_intent_without_a_field_the_code_needs_is_unreadable() {
    for missing in ["id", "amount", "currency", "status"] {
        let mut sparse = fixture("payment_intent_sparse");
        sparse.as_object_mut().unwrap().remove(missing);
        assert!(serde_json::from_value::<PaymentIntent>(sparse).is_err(), "{missing}");
    }
}

#[test]
fn an_intent_read_back_from_its_stored_form_is_the_same_intent() {
    for name in [
        "payment_intent_full",
        "payment_intent_older_shape",
        "payment_intent_expanded_charge",
        "payment_intent_requires_action_redirect",
    ] {
        let read = intent(fixture(name));
        let stored = serde_json::to_value(&read).unwrap();
        assert_eq!(intent(stored), read, "{name}");
    }
}

#[test]
fn refunds_read_as_stripe_sends_them_and_sparse() {
    let full: Refund = serde_json::from_value(fixture("refund_of_payment_intent")).unwrap();
    assert_eq!(full.id, "re_3Qrefund0000001");
    assert_eq!(full.payment_intent.as_deref(), Some("pi_3QxFull0000000001"));
    assert_eq!(full.charge.as_deref(), Some("ch_3QxFull0000000001"));
    assert_eq!((full.amount, full.status.as_str()), (200, "succeeded"));
    assert_eq!(full.metadata["refund_id"], "re_9");

    let sparse: Refund = serde_json::from_value(fixture("refund_sparse")).unwrap();
    assert_eq!(sparse.payment_intent.as_deref(), Some("pi_sparse"));
    assert_eq!(sparse.charge, None);
    assert_eq!(sparse.status, "succeeded", "a server that says nothing refunded at once");
    assert!(sparse.metadata.is_empty());
}
