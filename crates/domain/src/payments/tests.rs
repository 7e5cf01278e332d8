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

#[test]
fn a_valid_request_keeps_what_its_rules_parsed() {
    let metadata = BTreeMap::from([("order".to_owned(), "42".to_owned())]);
    let valid = CreatePaymentRequest {
        currency: "eur".into(),
        capture_method: CaptureMethod::Manual,
        metadata: Some(metadata.clone()),
        ..request()
    }
    .validate()
    .expect("the request is valid");
    assert_eq!(valid.amount, Amount::new(500).expect("500 is an amount"));
    assert_eq!(valid.currency, Currency::new("eur").expect("eur is supported"));
    assert_eq!((valid.capture_method, valid.metadata), (CaptureMethod::Manual, metadata));
    assert!(request().validate().expect("valid").metadata.is_empty());
}
