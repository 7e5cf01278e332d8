//! Stripe's webhook signature scheme, both halves: `t=<unix>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<body>")>`. The stand-in signs its `Stripe-Signature` with [`sign`]; the API verifies
//! what the processor sends with [`verify`] (and signs its own `Payments-Signature` with [`sign`]).
//!
//! Verification follows `stripe.Webhook.construct_event`: the MAC is computed once over the exact
//! bytes received, every `v1` in the header is compared with it in constant time (`hmac`'s own
//! `CtOutput`); then the timestamp must be within the tolerance of now, so a delivery captured
//! and replayed later is refused. A header with more than [`MAX_SIGNATURES`] `v1` entries is
//! refused before any hashing, so a header cannot multiply the work done per request.

use std::time::Duration;

use hmac::digest::{CtOutput, Output};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header the processor's signature travels in.
pub const STRIPE_SIGNATURE_HEADER: &str = "Stripe-Signature";

/// The tolerance Stripe's libraries use: five minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// The most `v1` entries one header may carry. Stripe sends one per live secret (two while a
/// secret is rolled), so this is far above any real header and far below one that is a
/// denial of service.
pub const MAX_SIGNATURES: usize = 16;

fn mac(secret: &str, unix_seconds: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(unix_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// `t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub fn sign(secret: &str, unix_seconds: i64, body: &[u8]) -> String {
    let signature = hex::encode(mac(secret, unix_seconds, body).finalize().into_bytes());
    format!("t={unix_seconds},v1={signature}")
}

/// Why a signed payload was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `t=` or no `v1=` in the header, or a `t` that is not a number.
    #[error("the signature header is malformed (it needs t=<unix seconds> and v1=<hex>)")]
    MalformedHeader,
    /// No `v1` signature matches the payload under the secret.
    #[error("no signature in the header matches the payload")]
    NoMatch,
    /// The timestamp is further from now than the tolerance: a replay, or a skewed clock.
    #[error("the signature's timestamp is outside the tolerance")]
    OutsideTolerance,
    /// More than [`MAX_SIGNATURES`] `v1` entries: refused before any of them is checked.
    #[error("the signature header has more than {MAX_SIGNATURES} v1 signatures")]
    TooManySignatures,
}

/// A `Stripe-Signature` header, parsed: its timestamp and its `v1` signatures (hex, unchecked).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SignatureHeader<'a> {
    timestamp: i64,
    signatures: Vec<&'a str>,
}

impl<'a> SignatureHeader<'a> {
    /// `t=<unix seconds>` and one to [`MAX_SIGNATURES`] `v1=` entries; other schemes (v0, a future
    /// v2) are not ours to judge, and are skipped.
    fn parse(header: &'a str) -> Result<Self, SignatureError> {
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", value)) => {
                    timestamp =
                        Some(value.parse::<i64>().map_err(|_| SignatureError::MalformedHeader)?);
                }
                Some(("v1", value)) => {
                    if signatures.len() == MAX_SIGNATURES {
                        return Err(SignatureError::TooManySignatures);
                    }
                    signatures.push(value);
                }
                _ => {}
            }
        }
        let timestamp = timestamp.ok_or(SignatureError::MalformedHeader)?;
        if signatures.is_empty() {
            return Err(SignatureError::MalformedHeader);
        }
        Ok(Self { timestamp, signatures })
    }

    /// Whether the timestamp is within `tolerance` of `now`.
    fn check_time(&self, tolerance: Duration, now: i64) -> Result<(), SignatureError> {
        if now.abs_diff(self.timestamp) > tolerance.as_secs() {
            return Err(SignatureError::OutsideTolerance);
        }
        Ok(())
    }
}

/// Checks `header` against `payload` as of `now` (unix seconds): the signature first (nothing
/// is parsed before it holds), then the timestamp. The MAC is computed once, however many `v1`
/// entries the header has.
pub fn verify(
    payload: &[u8],
    header: &str,
    secret: &str,
    tolerance: Duration,
    now: i64,
) -> Result<(), SignatureError> {
    let header = SignatureHeader::parse(header)?;
    if !any_signature_matches(
        &mac(secret, header.timestamp, payload).finalize(),
        &header.signatures,
    ) {
        return Err(SignatureError::NoMatch);
    }
    header.check_time(tolerance, now)
}

/// What [`verify`] checks of `header` without the payload: well-formed (`t=<unix seconds>`, one to
/// [`MAX_SIGNATURES`] `v1=` entries) and within `tolerance` of `now`. It proves nothing about the
/// sender (anyone can write such a header), but costs nothing, so a receiver can refuse a
/// delivery that [`verify`] would refuse whatever its body before reading the body.
pub fn check_header(header: &str, tolerance: Duration, now: i64) -> Result<(), SignatureError> {
    SignatureHeader::parse(header)?.check_time(tolerance, now)
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

    #[test]
    fn the_signature_is_stripes_scheme_as_openssl_computes_it() {
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_test
        assert_eq!(
            sign(SECRET, 1_700_000_000, br#"{"a":1}"#),
            "t=1700000000,v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"
        );
    }

    #[test]
    fn a_payload_signed_with_the_secret_within_the_tolerance_verifies() {
        let header = sign(SECRET, 1000, b"{}");
        assert_eq!(verify(b"{}", &header, SECRET, DEFAULT_TOLERANCE, 1299), Ok(()));
        // Stripe rolls secrets by sending one signature per secret: any `v1` may match.
        let two = format!("t=1000,v1=00,{}", header.trim_start_matches("t=1000,"));
        assert_eq!(verify(b"{}", &two, SECRET, DEFAULT_TOLERANCE, 1000), Ok(()));
    }

    #[test]
    fn a_changed_payload_another_secret_or_a_garbled_signature_is_refused() {
        let header = sign(SECRET, 1000, b"{}");
        let refused = Err(SignatureError::NoMatch);
        assert_eq!(verify(b"{ }", &header, SECRET, DEFAULT_TOLERANCE, 1000), refused);
        assert_eq!(verify(b"{}", &header, "whsec_other", DEFAULT_TOLERANCE, 1000), refused);
        assert_eq!(verify(b"{}", "t=1000,v1=zz", SECRET, DEFAULT_TOLERANCE, 1000), refused);
        // The timestamp is signed too: moving it breaks the signature.
        let moved = header.replace("t=1000", "t=2000");
        assert_eq!(verify(b"{}", &moved, SECRET, DEFAULT_TOLERANCE, 2000), refused);
    }

    #[test]
    fn an_old_or_future_timestamp_is_refused_even_with_a_good_signature() {
        let header = sign(SECRET, 1000, b"{}");
        let outside = Err(SignatureError::OutsideTolerance);
        assert_eq!(verify(b"{}", &header, SECRET, DEFAULT_TOLERANCE, 1301), outside);
        assert_eq!(verify(b"{}", &header, SECRET, DEFAULT_TOLERANCE, 699), outside);
    }

    #[test]
    fn a_header_without_a_timestamp_or_a_signature_is_malformed() {
        for header in ["", "v1=00", "t=1000", "t=abc,v1=00"] {
            assert_eq!(
                verify(b"{}", header, SECRET, DEFAULT_TOLERANCE, 1000),
                Err(SignatureError::MalformedHeader),
                "{header}"
            );
        }
    }

    /// `t=1000`, then `decoys` empty `v1` entries, then the good signature for `b"{}"`.
    fn header_with_decoys_before_the_signature(decoys: usize) -> String {
        let good = sign(SECRET, 1000, b"{}");
        format!("t=1000,{}{}", "v1=,".repeat(decoys), good.trim_start_matches("t=1000,"))
    }

    #[test]
    fn a_good_signature_after_other_entries_verifies_up_to_the_cap() {
        let header = header_with_decoys_before_the_signature(MAX_SIGNATURES - 1);
        assert_eq!(verify(b"{}", &header, SECRET, DEFAULT_TOLERANCE, 1000), Ok(()));
    }

    #[test]
    fn a_header_with_more_signatures_than_the_cap_is_refused_even_if_one_matches() {
        let header = header_with_decoys_before_the_signature(MAX_SIGNATURES);
        assert_eq!(
            verify(b"{}", &header, SECRET, DEFAULT_TOLERANCE, 1000),
            Err(SignatureError::TooManySignatures)
        );
        // The flood from the review: 100k empty entries over a 64 KiB body, refused unhashed.
        let flood = format!("t=1000{}", ",v1=".repeat(100_000));
        assert_eq!(
            verify(&[0; 64 * 1024], &flood, SECRET, DEFAULT_TOLERANCE, 1000),
            Err(SignatureError::TooManySignatures)
        );
    }

    #[test]
    fn candidates_are_compared_with_the_mac_computed_once() {
        let expected = mac(SECRET, 1000, b"{}").finalize();
        let good = hex::encode(expected.clone().into_bytes());
        let upper = good.to_uppercase();
        // Only exactly 32 bytes of hex can match; empty or short entries never do.
        assert!(!any_signature_matches(&expected, &["", "00", "zz", &good[..62]]));
        assert!(!any_signature_matches(&expected, &[&format!("{good}00")]));
        assert!(any_signature_matches(&expected, &["", "00", &good]));
        assert!(any_signature_matches(&expected, &[&upper]));
    }
}
