//! The `Idempotency-Key` header: parsing and validation.
//!
//! A value that starts with `"` is an RFC 9651 sf-string and must parse completely (only `\"` and
//! `\\` escapes, the closing quote last). Any other value is bare, as Stripe's clients send it: 1
//! to 255 visible ASCII characters (0x21 to 0x7E). Either way the decoded key is 1 to 255
//! printable ASCII characters (0x20 to 0x7E), compared case-sensitively, so `"abc"` and `abc`
//! name the same key.

use std::fmt;

/// The longest key accepted, in characters.
pub const MAX_KEY_CHARS: usize = 255;

/// A validated idempotency key, as the client meant it (quotes and escapes removed).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The header appeared on more than one line.
    #[error("the Idempotency-Key header appears more than once")]
    Repeated,
    /// The decoded key is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The decoded key is longer than 255 characters.
    #[error("the Idempotency-Key is longer than {MAX_KEY_CHARS} characters")]
    TooLong,
    /// A character outside what the form allows.
    #[error("the Idempotency-Key has a character outside printable ASCII at position {0}")]
    BadCharacter(usize),
    /// A quoted value is not a complete sf-string.
    #[error("the Idempotency-Key starts with a quote but is not a valid RFC 9651 string")]
    BadString,
}

impl IdempotencyKey {
    /// Parses the values of every `Idempotency-Key` header line of a request. No line at all is
    /// `Ok(None)`: whether a key is required is the caller's business.
    pub fn from_header_values<'a>(
        mut values: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Option<Self>, KeyError> {
        let Some(first) = values.next() else { return Ok(None) };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(first).map(Some)
    }

    /// Parses one header value.
    pub fn parse(value: &[u8]) -> Result<Self, KeyError> {
        let decoded = match value.first() {
            Some(b'"') => parse_sf_string(value)?,
            _ => parse_bare(value)?,
        };
        if decoded.is_empty() {
            return Err(KeyError::Empty);
        }
        if decoded.len() > MAX_KEY_CHARS {
            return Err(KeyError::TooLong);
        }
        Ok(Self(decoded))
    }

    /// The key as the client meant it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an RFC 9651 sf-string (always a valid header value).
    pub fn to_sf_string(&self) -> String {
        let mut quoted = String::with_capacity(self.0.len() + 2);
        quoted.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                quoted.push('\\');
            }
            quoted.push(c);
        }
        quoted.push('"');
        quoted
    }
}

fn parse_bare(value: &[u8]) -> Result<String, KeyError> {
    if let Some(position) = value.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        return Err(KeyError::BadCharacter(position));
    }
    // Every byte is ASCII, so this cannot fail.
    String::from_utf8(value.to_vec()).map_err(|_| KeyError::BadString)
}

fn parse_sf_string(value: &[u8]) -> Result<String, KeyError> {
    let mut decoded = String::with_capacity(value.len());
    let mut bytes = value.iter().enumerate().skip(1);
    while let Some((position, &byte)) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some((_, &escaped @ (b'"' | b'\\'))) => decoded.push(char::from(escaped)),
                _ => return Err(KeyError::BadString),
            },
            b'"' => {
                return if position == value.len() - 1 {
                    Ok(decoded)
                } else {
                    Err(KeyError::BadString)
                };
            }
            0x20..=0x7e => decoded.push(char::from(byte)),
            _ => return Err(KeyError::BadCharacter(position)),
        }
    }
    Err(KeyError::BadString)
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({})", self.to_sf_string())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(value: &str) -> Result<String, KeyError> {
        IdempotencyKey::parse(value.as_bytes()).map(|k| k.0)
    }

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        assert_eq!(parse("abc").unwrap(), "abc");
        assert_eq!(parse("\"abc\"").unwrap(), "abc");
        assert_eq!(parse(r#""a \"b\" \\c""#).unwrap(), r#"a "b" \c"#);
        assert_eq!(
            parse("8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap(),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
    }

    #[test]
    fn keys_are_case_sensitive() {
        assert_ne!(parse("Key").unwrap(), parse("key").unwrap());
    }

    #[test]
    fn malformed_values_are_refused_with_a_reason() {
        assert_eq!(parse(""), Err(KeyError::Empty));
        assert_eq!(parse("\"\""), Err(KeyError::Empty));
        assert_eq!(parse("a b"), Err(KeyError::BadCharacter(1)));
        assert_eq!(parse("caf\u{e9}"), Err(KeyError::BadCharacter(3)));
        assert_eq!(parse("\"abc"), Err(KeyError::BadString));
        assert_eq!(parse("\"abc\"x"), Err(KeyError::BadString));
        assert_eq!(parse(r#""a\nb""#), Err(KeyError::BadString));
        assert_eq!(parse("\"tab\there\""), Err(KeyError::BadCharacter(4)));
        assert_eq!(parse(&"k".repeat(255)).map(|k| k.len()), Ok(255));
        assert_eq!(parse(&"k".repeat(256)), Err(KeyError::TooLong));
        assert_eq!(parse(&format!("\"{}\"", "k".repeat(256))), Err(KeyError::TooLong));
    }

    #[test]
    fn a_header_on_two_lines_is_refused_even_with_equal_values() {
        let twice = [b"abc".as_slice(), b"abc".as_slice()];
        assert_eq!(IdempotencyKey::from_header_values(twice.into_iter()), Err(KeyError::Repeated));
        assert_eq!(IdempotencyKey::from_header_values(std::iter::empty()), Ok(None));
    }

    proptest! {
        #[test]
        fn every_valid_key_round_trips_through_its_quoted_form(key in "[ -~]{1,255}") {
            let parsed = IdempotencyKey::parse(key.as_bytes());
            // A bare value may not hold spaces, so parse the quoted form, which always can.
            let quoted = IdempotencyKey(key.clone()).to_sf_string();
            let reparsed = IdempotencyKey::parse(quoted.as_bytes()).unwrap();
            prop_assert_eq!(reparsed.as_str(), key.as_str());
            if let Ok(bare) = parsed
                && !key.starts_with('"')
            {
                prop_assert_eq!(bare, reparsed);
            }
        }

        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(key) = IdempotencyKey::parse(&bytes) {
                prop_assert!(!key.as_str().is_empty() && key.as_str().len() <= MAX_KEY_CHARS);
                prop_assert!(key.as_str().bytes().all(|b| (0x20..=0x7e).contains(&b)));
            }
        }

        #[test]
        fn bare_visible_ascii_values_parse_to_themselves(key in "[!-~]{1,255}") {
            prop_assume!(!key.starts_with('"'));
            let parsed = IdempotencyKey::parse(key.as_bytes()).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }
    }
}
