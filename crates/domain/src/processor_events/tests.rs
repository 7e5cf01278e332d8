//! Tests of a delivery's verification: the header checked before the body, the signature before
//! parsing, and the events this endpoint takes.

#![allow(clippy::unwrap_used)]

use provider::signature::{self, SignatureError};
use serde_json::json;

use super::*;

const SECRET: &str = "whsec_processor";
const NOW: i64 = 1_700_000_000;

fn event(kind: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": "evt_1", "object": "event", "api_version": "2024-06-20", "created": NOW,
        "livemode": false, "pending_webhooks": 1, "type": kind,
        "request": {"id": null, "idempotency_key": "pay_1/charge"},
        "data": {"object": {
            "id": "ch_1", "object": "charge", "amount": 500, "currency": "usd",
            "captured": true, "paid": true, "status": "succeeded", "amount_captured": 500,
            "amount_refunded": 0, "refunded": false, "metadata": {"payment_id": "pay_1"},
        }},
    }))
    .unwrap()
}

fn check(payload: &[u8], header: &str) -> Result<ProcessorEvent, Refused> {
    verify(payload, Some(header), SECRET, signature::DEFAULT_TOLERANCE, NOW)
}

#[test]
fn a_header_that_no_body_could_make_good_is_refused_before_the_body() {
    let tolerance = signature::DEFAULT_TOLERANCE;
    let good = signature::sign(SECRET, NOW, b"{}");
    assert_eq!(check_header(Some(&good), tolerance, NOW), Ok(()));
    // Not verified: any `v1` passes here, the body decides.
    assert_eq!(check_header(Some("t=1700000000,v1=00"), tolerance, NOW + 300), Ok(()));
    assert_eq!(check_header(None, tolerance, NOW), Err(Refused::NoSignature));
    let malformed = Err(Refused::Signature(SignatureError::MalformedHeader));
    for header in ["", "v1=00", "t=1700000000", "t=abc,v1=00"] {
        assert_eq!(check_header(Some(header), tolerance, NOW), malformed, "{header}");
    }
    let outside = Err(Refused::Signature(SignatureError::OutsideTolerance));
    assert_eq!(check_header(Some(&good), tolerance, NOW + 301), outside);
    assert_eq!(check_header(Some(&good), tolerance, NOW - 301), outside);
    // A header that `verify` would refuse for its size is refused before the body too.
    let flood = format!("t={NOW}{}", ",v1=00".repeat(signature::MAX_SIGNATURES + 1));
    let too_many = Err(Refused::Signature(SignatureError::TooManySignatures));
    assert_eq!(check_header(Some(&flood), tolerance, NOW), too_many);
}

#[test]
fn a_signed_charge_event_is_read_with_its_downstream_key() {
    let body = event("charge.succeeded");
    let read = check(&body, &signature::sign(SECRET, NOW, &body)).unwrap();
    assert_eq!(read.id, "evt_1");
    assert_eq!(read.event_type, ProcessorEventType::ChargeSucceeded);
    assert!(matches!(&read.reported, Reported::Charge(charge) if charge.id == "ch_1"));
    assert_eq!(read.reported.payment_id(), Some("pay_1"));
    assert_eq!(read.downstream_key.as_deref(), Some("pay_1/charge"));
}

/// A PaymentIntent event as Stripe sends it after a customer's authentication: no request key.
fn intent_event(kind: &str, status: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": "evt_2", "object": "event", "api_version": "2026-10-28.endive", "created": NOW,
        "livemode": false, "pending_webhooks": 1, "type": kind,
        "request": {"id": null, "idempotency_key": null},
        "data": {"object": {
            "id": "pi_1", "object": "payment_intent", "amount": 500, "currency": "usd",
            "status": status, "amount_received": 500, "latest_charge": "ch_1",
            "metadata": {"payment_id": "pay_1"}, "next_action": null,
        }},
    }))
    .unwrap()
}

#[test]
fn a_signed_payment_intent_event_is_read_as_a_payment_intent() {
    let body = intent_event("payment_intent.succeeded", "succeeded");
    let read = check(&body, &signature::sign(SECRET, NOW, &body)).unwrap();
    assert_eq!(read.event_type, ProcessorEventType::IntentSucceeded);
    let Reported::Intent(intent) = &read.reported else { panic!("not an intent: {read:?}") };
    assert_eq!((intent.id.as_str(), intent.latest_charge.as_deref()), ("pi_1", Some("ch_1")));
    assert_eq!(read.reported.payment_id(), Some("pay_1"));
    assert_eq!(read.downstream_key, None);
    // A charge where a PaymentIntent belongs is no event this endpoint can read.
    let charge_as_intent = event("payment_intent.succeeded");
    let refused = check(&charge_as_intent, &signature::sign(SECRET, NOW, &charge_as_intent));
    assert!(matches!(refused, Err(Refused::Malformed(_))), "{refused:?}");
}

#[test]
fn a_bad_signature_an_old_timestamp_or_no_header_is_refused_before_parsing() {
    let body = event("charge.succeeded");
    let other = signature::sign("whsec_other", NOW, &body);
    assert_eq!(check(&body, &other).err(), Some(Refused::Signature(SignatureError::NoMatch)));
    let old = signature::sign(SECRET, NOW - 301, &body);
    assert_eq!(
        check(&body, &old).err(),
        Some(Refused::Signature(SignatureError::OutsideTolerance))
    );
    let none = verify(&body, None, SECRET, signature::DEFAULT_TOLERANCE, NOW);
    assert_eq!(none.err(), Some(Refused::NoSignature));
    // Garbage with a bad signature is a signature problem, not a parse problem.
    assert_eq!(check(b"not json", &other).err(), Some(Refused::Signature(SignatureError::NoMatch)));
}

#[test]
fn an_unknown_type_or_a_payload_that_is_no_charge_event_is_refused() {
    let body = event("customer.created");
    let refused = check(&body, &signature::sign(SECRET, NOW, &body)).err();
    let unknown = Refused::UnknownType { event: "evt_1".into(), kind: "customer.created".into() };
    assert_eq!(refused, Some(unknown));
    for body in [
        b"not json".to_vec(),
        br#"{"id":"evt_1","object":"event","type":"charge.succeeded","created":1,"data":{"object":{}}}"#.to_vec(),
        br#"{"id":"x_1","object":"event","type":"charge.succeeded","created":1,"data":{"object":{}}}"#.to_vec(),
    ] {
        let refused = check(&body, &signature::sign(SECRET, NOW, &body)).err();
        assert!(matches!(refused, Some(Refused::Malformed(_))), "{refused:?}");
    }
}
