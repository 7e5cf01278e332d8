//! Verifying a webhook delivery: the receiving half of at-least-once.
//!
//! Each delivery carries `Payments-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`
//! (Stripe's scheme). [`verify`] recomputes it once over the raw body with the endpoint's secret,
//! compares each `v1` with it in constant time (`hmac`'s own `CtOutput`), and refuses a timestamp
//! outside the tolerance, so a captured delivery replayed later is refused. A header with more
//! than [`MAX_SIGNATURES`] `v1` entries is refused before any hashing, so a sender cannot make
//! one request cost many hashes of the body. A verified delivery may still be
//! a redelivery: record its event id in the same transaction as its effect (the idempotent
//! consumer; see `examples/webhook_receiver.rs`).
//!
//! ```
//! use std::time::Duration;
//! # let (body, header) = (b"{}", "t=0,v1=00");
//! match payments_client::webhooks::verify(body, header, "whsec_…", Duration::from_secs(300)) {
//!     Ok(event) => println!("{} {}", event.id, event.event_type),
//!     Err(err) => println!("400: {err}"),
//! }
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::digest::{CtOutput, Output};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::Value;
use sha2::Sha256;

/// The header the signature travels in.
pub const SIGNATURE_HEADER: &str = "Payments-Signature";

/// The tolerance Stripe's libraries use, and a good default: five minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// The most `v1` entries one header may carry. The API sends one; a sender rolling its secret
/// might send a few. Far above any real header, far below one that is a denial of service.
pub const MAX_SIGNATURES: usize = 16;

/// A verified event.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    /// `evt_…`: the key a receiver dedupes by.
    pub id: String,
    /// `payment.succeeded`, …
    #[serde(rename = "type")]
    pub event_type: String,
    /// Unix seconds: when the change committed.
    pub created: i64,
    /// `{"object": …}`: the object right after the change.
    pub data: Value,
}

/// Why a delivery was refused. Every case is a `400` to the sender, and nothing is recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// No `t=` or no `v1=` in the header, or a `t` that is not a number.
    #[error("the signature header is malformed")]
    MalformedHeader,
    /// No `v1` signature matches the body under this secret.
    #[error("no signature matches the payload")]
    BadSignature,
    /// The timestamp is further from now than the tolerance: a replay, or a skewed clock.
    #[error("the timestamp is outside the tolerance")]
    OutsideTolerance,
    /// More than [`MAX_SIGNATURES`] `v1` entries: refused before any of them is checked.
    #[error("the signature header has more than {MAX_SIGNATURES} v1 signatures")]
    TooManySignatures,
    /// The body is signed but is not an event.
    #[error("the payload is not an event: {0}")]
    MalformedPayload(String),
}

/// Verifies a delivery at the current time; see [`verify_at`].
pub fn verify(
    payload: &[u8],
    header: &str,
    secret: &str,
    tolerance: Duration,
) -> Result<Event, VerifyError> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    verify_at(payload, header, secret, tolerance, i64::try_from(now).unwrap_or(i64::MAX))
}

/// Verifies a delivery as of `now` (unix seconds): the signature first, over the exact bytes
/// received (parse nothing before it), then the timestamp, then the payload's shape. The MAC
/// is computed once, however many `v1` entries the header has.
pub fn verify_at(
    payload: &[u8],
    header: &str,
    secret: &str,
    tolerance: Duration,
    now: i64,
) -> Result<Event, VerifyError> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => {
                timestamp = Some(value.parse::<i64>().map_err(|_| VerifyError::MalformedHeader)?);
            }
            Some(("v1", value)) => {
                if signatures.len() == MAX_SIGNATURES {
                    return Err(VerifyError::TooManySignatures);
                }
                signatures.push(value);
            }
            _ => {} // other schemes (a future v2) are not ours to judge
        }
    }
    let timestamp = timestamp.ok_or(VerifyError::MalformedHeader)?;
    if signatures.is_empty() {
        return Err(VerifyError::MalformedHeader);
    }
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
        return Err(VerifyError::BadSignature);
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    if !any_signature_matches(&mac.finalize(), &signatures) {
        return Err(VerifyError::BadSignature);
    }
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if now.abs_diff(timestamp) > tolerance.unsigned_abs() {
        return Err(VerifyError::OutsideTolerance);
    }
    serde_json::from_slice(payload).map_err(|err| VerifyError::MalformedPayload(err.to_string()))
}

/// Whether any of `signatures` (hex) is `expected`, compared in constant time. Taking the MAC
/// already computed is the point: checking one more candidate costs a comparison, not a hash
/// of the body. An entry that is not exactly 32 bytes of hex (empty, short, garbled) matches
/// nothing.
fn any_signature_matches(expected: &CtOutput<Hmac<Sha256>>, signatures: &[&str]) -> bool {
    signatures.iter().any(|signature| {
        let mut candidate = Output::<Hmac<Sha256>>::default();
        hex::decode_to_slice(signature, &mut candidate).is_ok()
            && CtOutput::new(candidate) == *expected
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test";
    const BODY: &[u8] =
        br#"{"id":"evt_1","type":"payment.succeeded","created":1,"data":{"object":{}}}"#;

    fn sign(t: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(body);
        format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn a_delivery_signed_with_the_secret_within_the_tolerance_verifies() {
        let event = verify_at(BODY, &sign(1000, BODY), SECRET, DEFAULT_TOLERANCE, 1100).unwrap();
        assert_eq!(event.id, "evt_1");
        assert_eq!(event.event_type, "payment.succeeded");
    }

    #[test]
    fn the_signature_matches_stripes_scheme_as_openssl_computes_it() {
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_test
        let header =
            "t=1700000000,v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789";
        let err = verify_at(br#"{"a":1}"#, header, SECRET, DEFAULT_TOLERANCE, 1_700_000_000);
        // The signature holds; the body is no event.
        assert!(matches!(err, Err(VerifyError::MalformedPayload(_))), "{err:?}");
    }

    #[test]
    fn a_changed_body_a_wrong_secret_or_a_garbled_signature_is_refused() {
        let header = sign(1000, BODY);
        let changed =
            br#"{"id":"evt_2","type":"payment.succeeded","created":1,"data":{"object":{}}}"#;
        assert_eq!(
            verify_at(changed, &header, SECRET, DEFAULT_TOLERANCE, 1000).err(),
            Some(VerifyError::BadSignature)
        );
        assert_eq!(
            verify_at(BODY, &header, "whsec_other", DEFAULT_TOLERANCE, 1000).err(),
            Some(VerifyError::BadSignature)
        );
        assert_eq!(
            verify_at(BODY, "t=1000,v1=zz", SECRET, DEFAULT_TOLERANCE, 1000).err(),
            Some(VerifyError::BadSignature)
        );
    }

    #[test]
    fn a_replayed_old_timestamp_is_refused_even_with_a_good_signature() {
        let header = sign(1000, BODY);
        assert_eq!(
            verify_at(BODY, &header, SECRET, DEFAULT_TOLERANCE, 1000 + 301).err(),
            Some(VerifyError::OutsideTolerance)
        );
        assert_eq!(
            verify_at(BODY, &header, SECRET, DEFAULT_TOLERANCE, 1000 - 301).err(),
            Some(VerifyError::OutsideTolerance)
        );
    }

    #[test]
    fn a_header_without_a_timestamp_or_a_signature_is_malformed() {
        for header in ["", "v1=00", "t=1000", "t=abc,v1=00"] {
            assert_eq!(
                verify_at(BODY, header, SECRET, DEFAULT_TOLERANCE, 1000).err(),
                Some(VerifyError::MalformedHeader),
                "{header}"
            );
        }
    }

    /// `t=1000`, then `decoys` empty `v1` entries, then the good signature for `BODY`.
    fn header_with_decoys_before_the_signature(decoys: usize) -> String {
        let good = sign(1000, BODY);
        format!("t=1000,{}{}", "v1=,".repeat(decoys), good.trim_start_matches("t=1000,"))
    }

    #[test]
    fn a_good_signature_after_other_entries_verifies_up_to_the_cap() {
        let header = header_with_decoys_before_the_signature(MAX_SIGNATURES - 1);
        let event = verify_at(BODY, &header, SECRET, DEFAULT_TOLERANCE, 1000).unwrap();
        assert_eq!(event.id, "evt_1");
    }

    #[test]
    fn a_header_with_more_signatures_than_the_cap_is_refused_even_if_one_matches() {
        let header = header_with_decoys_before_the_signature(MAX_SIGNATURES);
        assert_eq!(
            verify_at(BODY, &header, SECRET, DEFAULT_TOLERANCE, 1000).err(),
            Some(VerifyError::TooManySignatures)
        );
        // The flood from the review: 100k empty entries over a 64 KiB body, refused unhashed.
        let flood = format!("t=1000{}", ",v1=".repeat(100_000));
        assert_eq!(
            verify_at(&[0; 64 * 1024], &flood, SECRET, DEFAULT_TOLERANCE, 1000).err(),
            Some(VerifyError::TooManySignatures)
        );
    }

    #[test]
    fn candidates_are_compared_with_the_mac_computed_once() {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(b"1000.");
        mac.update(BODY);
        let expected = mac.finalize();
        let good = hex::encode(expected.clone().into_bytes());
        let upper = good.to_uppercase();
        // Only exactly 32 bytes of hex can match; empty or short entries never do.
        assert!(!any_signature_matches(&expected, &["", "00", "zz", &good[..62]]));
        assert!(!any_signature_matches(&expected, &[&format!("{good}00")]));
        assert!(any_signature_matches(&expected, &["", "00", &good]));
        assert!(any_signature_matches(&expected, &[&upper]));
    }

    #[test]
    fn a_signed_payload_that_is_not_json_is_malformed() {
        let body = b"not json";
        let err = verify_at(body, &sign(1000, body), SECRET, DEFAULT_TOLERANCE, 1000);
        assert!(matches!(err, Err(VerifyError::MalformedPayload(_))), "{err:?}");
    }
}
