//! The payment request's rules and the stored row's reading.

use super::*;
use crate::DomainError;

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

/// The one check of free text ([`crate::text`]) holds in each field of a payment request, and
/// the refusal names the field.
#[test]
fn control_and_format_characters_are_refused_in_each_field_naming_it() {
    let pairs = |key: &str, value: &str| Some(BTreeMap::from([(key.to_owned(), value.to_owned())]));
    for c in ['\u{0}', '\u{1b}', '\u{202e}', '\u{2066}', '\u{200b}', '\u{feff}', '\u{ad}'] {
        let cases = [
            (
                CreatePaymentRequest { description: Some(format!("Mugs{c}")), ..request() },
                "description",
            ),
            (
                CreatePaymentRequest { metadata: pairs(&format!("k{c}"), "v"), ..request() },
                "metadata",
            ),
            (
                CreatePaymentRequest { metadata: pairs("k", &format!("v{c}")), ..request() },
                "metadata",
            ),
            (
                CreatePaymentRequest {
                    receipt_email: Some(format!("jo{c}@example.com")),
                    ..request()
                },
                "receipt_email",
            ),
        ];
        for (request, param) in cases {
            assert_eq!(param_of(&request), Some(param), "U+{:04X} in {param}", u32::from(c));
        }
        let patch = PaymentPatch { description: Some(Some(format!("Mugs{c}"))), metadata: None };
        assert!(matches!(patch.validate(), Err(DomainError::Invalid { param: "description", .. })));
        let refund = crate::refunds::CreateRefundRequest {
            amount: None,
            reason: None,
            metadata: pairs("k", &format!("v{c}")),
        };
        assert!(matches!(refund.validate(), Err(DomainError::Invalid { param: "metadata", .. })));
        let changes = BTreeMap::from([("k".to_owned(), Some(format!("v{c}")))]);
        let patch = PaymentPatch { description: None, metadata: Some(Some(changes)) };
        assert!(matches!(patch.validate(), Err(DomainError::Invalid { param: "metadata", .. })));
    }
    // Text that spans lines stays text in a description and a metadata value, not in a key.
    let lines = "line one\r\nline\ttwo";
    assert_eq!(
        param_of(&CreatePaymentRequest { description: Some(lines.into()), ..request() }),
        None
    );
    assert_eq!(param_of(&CreatePaymentRequest { metadata: pairs("k", lines), ..request() }), None);
    assert_eq!(
        param_of(&CreatePaymentRequest { metadata: pairs("k\n", "v"), ..request() }),
        Some("metadata")
    );
}

#[test]
fn the_etag_follows_the_representation() {
    let paid = br#"{"id":"pay_1","amount":500,"status":"succeeded"}"#;
    // The same bytes, held apart, have one ETag: the ETag is a function of the bytes alone.
    let copy = paid.to_vec();
    assert_eq!(Payment::etag_of(paid), Payment::etag_of(&copy));
    // Any change to the representation changes it: a field's value, the status, one byte of
    // whitespace, one byte more.
    let changed: [&[u8]; 4] = [
        br#"{"id":"pay_1","amount":501,"status":"succeeded"}"#,
        br#"{"id":"pay_1","amount":500,"status":"refunded"}"#,
        br#"{"id":"pay_1", "amount":500,"status":"succeeded"}"#,
        br#"{"id":"pay_1","amount":500,"status":"succeeded"} "#,
    ];
    let mut etags: Vec<String> = changed.iter().map(|bytes| Payment::etag_of(bytes)).collect();
    etags.push(Payment::etag_of(paid));
    etags.sort();
    etags.dedup();
    assert_eq!(etags.len(), changed.len() + 1, "every representation has its own ETag: {etags:?}");
    assert_ne!(Payment::etag_of(b"{}"), Payment::etag_of(b"{ }"));
    // A strong ETag as the code produces it: quoted, 24 lower-case hex digits (the first 12 bytes
    // of the SHA-256 of the bytes), so the ETag of `{}` is known in advance.
    let etag = Payment::etag_of(paid);
    let digits = etag.strip_prefix('"').and_then(|e| e.strip_suffix('"')).expect("quoted");
    assert_eq!(digits.len(), 24, "{etag}");
    assert!(digits.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')), "{etag}");
    assert_eq!(Payment::etag_of(b"{}"), "\"44136fa355b3678a1146ad16\"");
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
