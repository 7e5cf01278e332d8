//! A stored answer's body as the inspector shows it: the exact stored bytes, as a client replaying
//! the key receives them (members in their stored order and spacing), except that payment-method
//! tokens are shortened and a webhook endpoint's signing secret is hidden. The masking splices
//! the raw text at the places the JSON parser found those strings; nothing is re-serialized.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// What replaces a webhook endpoint's signing secret.
const HIDDEN_SECRET: &str = "whsec_… (hidden)";

/// The body as text: the stored bytes, with masked strings spliced in and any byte that is not
/// UTF-8 written as `\xNN`. A body that is not JSON is shown as it is (no operation stores one).
pub fn shown_body(body: &[u8]) -> String {
    let Ok(text) = std::str::from_utf8(body) else {
        return escape_invalid(body);
    };
    let mut masks = Vec::new();
    if let Ok(root) = serde_json::from_str::<&RawValue>(text) {
        collect_masks(text, root, None, &mut masks);
    }
    masks.sort_by_key(|(range, _)| range.start);
    let mut shown = String::with_capacity(text.len());
    let mut from = 0;
    for (range, replacement) in masks {
        shown.push_str(&text[from..range.start]);
        shown.push_str(&replacement);
        from = range.end;
    }
    shown.push_str(&text[from..]);
    shown
}

/// Every string to mask under `value` (which borrows from `text`), as (byte range in `text`, the
/// JSON literal to put there). `member` is the name `value` is stored under, if any.
fn collect_masks(
    text: &str,
    value: &RawValue,
    member: Option<&str>,
    masks: &mut Vec<(std::ops::Range<usize>, String)>,
) {
    let raw = value.get();
    match raw.as_bytes().first() {
        Some(b'"') => {
            let Some(replacement) = member.and_then(|name| masked(name, raw)) else { return };
            // `raw` is a slice of `text`: its offset is the distance between their addresses.
            let start = raw.as_ptr().addr() - text.as_ptr().addr();
            masks.push((start..start + raw.len(), replacement));
        }
        Some(b'{') => {
            let Ok(Members(members)) = serde_json::from_str::<Members<'_>>(raw) else { return };
            for (name, value) in members {
                collect_masks(text, value, Some(&name), masks);
            }
        }
        Some(b'[') => {
            let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(raw) else { return };
            for item in items {
                collect_masks(text, item, None, masks);
            }
        }
        _ => {}
    }
}

/// The literal that replaces string literal `raw` stored under `member`, if it is to be masked.
fn masked(member: &str, raw: &str) -> Option<String> {
    match member {
        "payment_method" => {
            let token: String = serde_json::from_str(raw).ok()?;
            serde_json::to_string(&mask(&token)).ok()
        }
        "secret" => serde_json::to_string(HIDDEN_SECRET).ok(),
        _ => None,
    }
}

/// The first 8 characters of a token, then `…`.
pub fn mask(token: &str) -> String {
    let shown: String = token.chars().take(8).collect();
    if shown.len() < token.len() { format!("{shown}…") } else { shown }
}

/// An object's members in their stored order, duplicates kept (a map type would keep one of
/// them, and the other would be shown unmasked).
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Collect;
        impl<'de> Visitor<'de> for Collect {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Members<'de>, A::Error> {
                Err(serde::de::Error::custom("not an object"))
            }
        }
        deserializer.deserialize_map(Collect)
    }
}

/// Bytes that are not UTF-8: the valid runs as text, every other byte as `\xNN`.
fn escape_invalid(body: &[u8]) -> String {
    let mut shown = String::with_capacity(body.len());
    for chunk in body.utf8_chunks() {
        shown.push_str(chunk.valid());
        for byte in chunk.invalid() {
            let _ = write!(shown, "\\x{byte:02x}");
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_masked() {
        assert_eq!(mask("pm_card_chargeDeclined"), "pm_card_…");
        assert_eq!(mask("short"), "short");
    }

    #[test]
    fn the_body_is_shown_byte_for_byte_in_its_stored_order() {
        // Members out of alphabetical order, odd spacing, an escape and a non-ASCII letter: a
        // re-serialized body would differ in each.
        let stored = "{\"status\":\"succeeded\", \"id\" :\"pay_1\",\n\"amount\":1250,\"description\":\"caf\u{e9} \\\"7\\\"\",\"payment_method\":\"pm_card_visa\"}";
        let shown = shown_body(stored.as_bytes());
        assert_eq!(
            shown,
            stored.replace("\"pm_card_visa\"", "\"pm_card_…\""),
            "only the token differs"
        );
    }

    #[test]
    fn every_token_and_secret_is_masked_wherever_it_is_stored() {
        let stored = r#"{"secret":"whsec_abcdef123456","data":[{"payment_method":"pm_card_mastercard"}],"payment_method":"pm_card_amex","payment_method":"pm_card_discover","note":"secret"}"#;
        let shown = shown_body(stored.as_bytes());
        assert_eq!(
            shown,
            r#"{"secret":"whsec_… (hidden)","data":[{"payment_method":"pm_card_…"}],"payment_method":"pm_card_…","payment_method":"pm_card_…","note":"secret"}"#
        );
        for leaked in ["abcdef123456", "mastercard", "amex", "discover"] {
            assert!(!shown.contains(leaked), "{leaked} shown: {shown}");
        }
    }

    #[test]
    fn a_token_written_with_escapes_is_masked_too() {
        let shown = shown_body(br#"{"payment_method":"pm_\u0063ard_visa_long"}"#);
        assert_eq!(shown, r#"{"payment_method":"pm_card_…"}"#);
    }

    #[test]
    fn a_body_that_is_not_json_or_not_utf8_is_shown_as_stored() {
        assert_eq!(shown_body(b"plain <text>"), "plain <text>");
        assert_eq!(shown_body(b"ok \xff\xfe end"), "ok \\xff\\xfe end");
    }
}
