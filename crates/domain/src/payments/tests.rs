//! The payment request's rules and the stored row's reading.

use super::*;

fn request() -> CreatePaymentRequest {
    CreatePaymentRequest {
        amount: 500,
        currency: "usd".into(),
        payment_method: "pm_card_visa".into(),
        capture_method: CaptureMethod::Automatic,
        description: None,
        metadata: None,
        receipt_email: None,
    }
}

fn param_of(request: &CreatePaymentRequest) -> Option<&'static str> {
    match request.validate() {
        Err(DomainError::Invalid { param, .. }) => Some(param),
        _ => None,
    }
}

#[test]
fn every_rule_names_its_parameter() {
    assert_eq!(param_of(&request()), None);
    assert_eq!(param_of(&CreatePaymentRequest { amount: 0, ..request() }), Some("amount"));
    assert_eq!(
        param_of(&CreatePaymentRequest { amount: 100_000_000, ..request() }),
        Some("amount")
    );
    assert_eq!(
        param_of(&CreatePaymentRequest { currency: "USD".into(), ..request() }),
        Some("currency")
    );
    assert_eq!(
        param_of(&CreatePaymentRequest { payment_method: "pm_x".into(), ..request() }),
        Some("payment_method")
    );
    let long = "x".repeat(1001);
    assert_eq!(
        param_of(&CreatePaymentRequest { description: Some(long), ..request() }),
        Some("description")
    );
    let bad_key = BTreeMap::from([("a[b]".to_owned(), "v".to_owned())]);
    assert_eq!(
        param_of(&CreatePaymentRequest { metadata: Some(bad_key), ..request() }),
        Some("metadata")
    );
    let many: BTreeMap<_, _> = (0..51).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    assert_eq!(
        param_of(&CreatePaymentRequest { metadata: Some(many), ..request() }),
        Some("metadata")
    );
    let long_value = BTreeMap::from([("k".to_owned(), "v".repeat(501))]);
    assert_eq!(
        param_of(&CreatePaymentRequest { metadata: Some(long_value), ..request() }),
        Some("metadata")
    );
    for email in ["nope", "a@b", "a b@c.d", "@c.d"] {
        assert_eq!(
            param_of(&CreatePaymentRequest { receipt_email: Some(email.into()), ..request() }),
            Some("receipt_email"),
            "{email}"
        );
    }
    assert_eq!(
        param_of(&CreatePaymentRequest {
            receipt_email: Some("jo@example.com".into()),
            ..request()
        }),
        None
    );
}

#[test]
fn the_etag_follows_the_representation() {
    assert_eq!(Payment::etag_of(b"{}"), Payment::etag_of(b"{}"));
    assert_ne!(Payment::etag_of(b"{}"), Payment::etag_of(b"{ }"));
    assert!(Payment::etag_of(b"{}").starts_with('"'));
}

fn row(capture_method: &str) -> PaymentRow {
    PaymentRow {
        id: "pay_1".into(),
        account_id: "acct_1".into(),
        idempotency_key_id: None,
        amount: 500,
        currency: "usd".into(),
        status: "requires_capture".into(),
        capture_method: capture_method.into(),
        amount_captured: 0,
        amount_refunded: 0,
        payment_method: "pm_card_visa".into(),
        description: None,
        metadata: serde_json::json!({}),
        receipt_email: None,
        processor_charge_id: None,
        failure_code: None,
        failure_message: None,
        cancellation_reason: None,
        created: 0,
    }
}

#[test]
fn an_unknown_stored_capture_method_is_an_error_not_a_default() {
    let manual = Payment::try_from(row("manual")).expect("a manual payment reads");
    assert_eq!(manual.capture_method, CaptureMethod::Manual);
    let automatic = Payment::try_from(row("automatic")).expect("an automatic payment reads");
    assert_eq!(automatic.capture_method, CaptureMethod::Automatic);
    for unknown in ["delayed", "", "Manual"] {
        assert!(
            matches!(
                Payment::try_from(row(unknown)),
                Err(DomainError::Corrupt("unknown capture method"))
            ),
            "{unknown:?}"
        );
    }
}

#[test]
fn an_unknown_stored_status_is_an_error() {
    assert!(matches!(
        Payment::try_from(PaymentRow { status: "pending".into(), ..row("manual") }),
        Err(DomainError::Corrupt("unknown payment status"))
    ));
}
