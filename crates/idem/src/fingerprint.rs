//! The request fingerprint: what makes two requests with one key "the same request".
//!
//! SHA-256 over the method, the path, the query string, the media type's essence, the
//! `Payments-Version` and `If-Match` headers when present, and the canonical JSON body (object members sorted,
//! no insignificant whitespace). Each part is framed with a tag and its length, so no two
//! different requests can be spliced into the same byte stream.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A request's fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// What a fingerprint is made of.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// `POST`, `PATCH`.
    pub method: &'a str,
    /// The path, as received.
    pub path: &'a str,
    /// The query string without `?`, empty when absent.
    pub query: &'a str,
    /// The media type's essence, lower case (`application/json`).
    pub media_type: &'a str,
    /// The `Payments-Version` header, when sent.
    pub version: Option<&'a str>,
    /// The `If-Match` header, when sent: a retry that corrects a stale precondition under the
    /// same key is another request, not the one whose `412` is stored.
    pub if_match: Option<&'a str>,
    /// The parsed JSON body.
    pub body: &'a Value,
}

impl Fingerprint {
    /// The fingerprint of a request.
    pub fn of(parts: &RequestParts<'_>) -> Self {
        let mut hasher = Sha256::new();
        frame(&mut hasher, b'M', parts.method.as_bytes());
        frame(&mut hasher, b'P', parts.path.as_bytes());
        frame(&mut hasher, b'Q', parts.query.as_bytes());
        frame(&mut hasher, b'T', parts.media_type.to_ascii_lowercase().as_bytes());
        if let Some(version) = parts.version {
            frame(&mut hasher, b'V', version.as_bytes());
        }
        if let Some(if_match) = parts.if_match {
            frame(&mut hasher, b'I', if_match.as_bytes());
        }
        frame(&mut hasher, b'B', &canonical_json(parts.body));
        Self(hasher.finalize().into())
    }

    /// Rebuilds a fingerprint read from the database.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint(")?;
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "…)")
    }
}

fn frame(hasher: &mut Sha256, tag: u8, bytes: &[u8]) {
    hasher.update([tag]);
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// The canonical form of a JSON value: members sorted by key (serde_json's map is ordered), no
/// insignificant whitespace, strings in their shortest escaping.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    // Serialising a `Value` cannot fail: its keys are strings and its numbers are finite.
    serde_json::to_vec(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn fingerprint(
        method: &str,
        path: &str,
        query: &str,
        media: &str,
        version: Option<&str>,
        body: &Value,
    ) -> Fingerprint {
        let media_type = media;
        Fingerprint::of(&RequestParts {
            method,
            path,
            query,
            media_type,
            version,
            if_match: None,
            body,
        })
    }

    fn base(body: &Value) -> Fingerprint {
        fingerprint("POST", "/v1/payments", "", "application/json", None, body)
    }

    #[test]
    fn reformatted_json_is_the_same_request() {
        let a: Value =
            serde_json::from_str(r#"{"amount":500,"currency":"usd","metadata":{"b":"1","a":"2"}}"#)
                .unwrap();
        let b: Value = serde_json::from_str("{\n  \"metadata\": {\"a\": \"2\", \"b\": \"1\"},\n  \"currency\" : \"\\u0075sd\",\n  \"amount\": 500\n}").unwrap();
        assert_eq!(base(&a), base(&b));
    }

    #[test]
    fn every_part_counts() {
        let body = json!({"amount": 500});
        let reference = base(&body);
        assert_ne!(
            reference,
            fingerprint("PATCH", "/v1/payments", "", "application/json", None, &body)
        );
        assert_ne!(
            reference,
            fingerprint("POST", "/v1/payments/x", "", "application/json", None, &body)
        );
        assert_ne!(
            reference,
            fingerprint("POST", "/v1/payments", "a=1", "application/json", None, &body)
        );
        assert_ne!(
            reference,
            fingerprint("POST", "/v1/payments", "", "application/merge-patch+json", None, &body)
        );
        assert_ne!(
            reference,
            fingerprint("POST", "/v1/payments", "", "application/json", Some("2026-01-01"), &body)
        );
        let conditional = |if_match| {
            let (method, path, query, media_type) =
                ("POST", "/v1/payments", "", "application/json");
            Fingerprint::of(&RequestParts {
                method,
                path,
                query,
                media_type,
                version: None,
                if_match,
                body: &body,
            })
        };
        assert_ne!(reference, conditional(Some("\"etag-1\"")));
        assert_ne!(conditional(Some("\"etag-1\"")), conditional(Some("\"etag-2\"")));
        assert_ne!(
            conditional(Some("2026-01-01")),
            fingerprint("POST", "/v1/payments", "", "application/json", Some("2026-01-01"), &body),
            "a version and an If-Match of the same text are different requests"
        );
        assert_ne!(reference, base(&json!({"amount": 501})));
        assert_ne!(reference, base(&json!({"amount": "500"})));
    }

    #[test]
    fn parts_cannot_be_spliced_into_each_other() {
        let body = json!({});
        assert_ne!(
            fingerprint("POST", "/v1/a", "b", "application/json", None, &body),
            fingerprint("POST", "/v1/ab", "", "application/json", None, &body)
        );
    }

    /// Arbitrary JSON, a few levels deep.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[ -~]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                proptest::collection::btree_map("[a-z]{1,6}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes a value with its object members in reverse order and whitespace everywhere.
    fn reformat(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| {
                        format!("\n  {} :\t{} ", serde_json::to_string(k).unwrap(), reformat(v))
                    })
                    .collect();
                format!("{{ {} }}", members.join(" , "))
            }
            Value::Array(items) => {
                format!("[ {} ]", items.iter().map(reformat).collect::<Vec<_>>().join(" ,\n"))
            }
            other => other.to_string(),
        }
    }

    /// What holds of the fingerprint of any body parsed from `bytes`: the bytes, parsed again,
    /// give the same fingerprint (it is a function of the request alone: nothing random, nothing
    /// kept from an earlier call); and the body counts: the same body inside an array gives
    /// another, as does the same body sent with another method.
    fn fingerprints_deterministically(bytes: &[u8], value: &Value) -> Result<(), TestCaseError> {
        let reference = base(value);
        let again: Value = serde_json::from_slice(bytes).expect("it parsed once");
        prop_assert_eq!(reference, base(&again));
        prop_assert_ne!(reference, base(&json!([value])));
        let patch = fingerprint("PATCH", "/v1/payments", "", "application/json", None, value);
        prop_assert_ne!(reference, patch);
        Ok(())
    }

    proptest! {
        /// A fuzz corpus in the small: any bytes a client may send as a body either fail to parse
        /// or fingerprint without panicking, deterministically.
        #[test]
        fn any_body_bytes_fingerprint_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                fingerprints_deterministically(&bytes, &value)?;
            }
        }

        #[test]
        fn any_json_text_fingerprints_without_panicking(text in "[\\[\\]{}:,\"0-9a-z.eE+ -]{0,64}") {
            if let Ok(value) = serde_json::from_str::<Value>(&text) {
                fingerprints_deterministically(text.as_bytes(), &value)?;
            }
        }

        #[test]
        fn reordering_members_or_reformatting_never_changes_it(value in json_value()) {
            let reparsed: Value = serde_json::from_str(&reformat(&value)).unwrap();
            prop_assert_eq!(base(&value), base(&reparsed));
        }

        #[test]
        fn changing_any_value_always_changes_it(value in json_value(), replacement in json_value()) {
            prop_assume!(value != replacement);
            prop_assert_ne!(base(&value), base(&replacement));
        }

        #[test]
        fn changing_the_path_query_or_media_type_always_changes_it(
            value in json_value(),
            path in "/v1/[a-z_/]{1,20}",
            query in "[a-z=&]{1,12}",
            media in "application/[a-z+-]{1,20}",
        ) {
            let reference = base(&value);
            prop_assume!(path != "/v1/payments" && media != "application/json");
            prop_assert_ne!(reference, fingerprint("POST", &path, "", "application/json", None, &value));
            prop_assert_ne!(reference, fingerprint("POST", "/v1/payments", &query, "application/json", None, &value));
            prop_assert_ne!(reference, fingerprint("POST", "/v1/payments", "", &media, None, &value));
        }
    }
}
