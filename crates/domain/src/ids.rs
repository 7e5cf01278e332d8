//! Public object ids: a type prefix and random characters, one newtype per object.
//!
//! Ids are unguessable (no sequence numbers leak how busy an account is) and URL-safe. 24
//! alphanumeric characters carry about 143 bits, so collisions are not a practical concern; the
//! primary keys would reject one anyway.
//!
//! Each id type is made in one of three ways: generated ([`PaymentId::generate`]), parsed from
//! outside (a path, a cursor, a command line, stored JSON: [`PaymentId::parse`] and its
//! `FromStr` and `Deserialize`, which accept only an id of the right shape), or read from its
//! column (`sqlx(transparent)`: the table holds only ids this code generated, or fixtures made
//! to look like them). On the wire and in the database an id is its text, unchanged.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand::distributions::Alphanumeric;
use serde::{Deserialize, Serialize};

/// How many random characters follow the prefix.
const ID_RANDOM_CHARS: usize = 24;

/// The most characters an id may have after its prefix: generous beside the 24 generated, so
/// that ids made elsewhere (fixtures, imports) still fit, and small enough to bound a lookup.
pub const ID_MAX_SUFFIX_CHARS: usize = 64;

/// A fresh id such as `req_3fQ9…` for the given prefix (without the underscore), for ids that
/// have no type of their own here (request ids).
pub fn new_id(prefix: &str) -> String {
    with_random_suffix(prefix, ID_RANDOM_CHARS)
}

/// Whether `id` has the shape of an id of this type: `prefix_` and 1 to 64 ASCII letters or
/// digits. A path id or cursor is checked with this before any query, so that bytes Postgres
/// would refuse (NUL) or that no id can hold never reach it.
pub fn is_well_formed(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).and_then(|rest| rest.strip_prefix('_')).is_some_and(|suffix| {
        (1..=ID_MAX_SUFFIX_CHARS).contains(&suffix.len())
            && suffix.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// `prefix_` followed by `len` random alphanumeric characters from the OS-seeded generator.
pub(crate) fn with_random_suffix(prefix: &str, len: usize) -> String {
    let mut id = String::with_capacity(prefix.len() + 1 + len);
    id.push_str(prefix);
    id.push('_');
    id.extend(rand::thread_rng().sample_iter(&Alphanumeric).take(len).map(char::from));
    id
}

/// Text that is not an id of the type asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{text}` is not an id of the form `{prefix}_…` (up to {ID_MAX_SUFFIX_CHARS} letters or digits)"
)]
pub struct NotAnId {
    /// The text, as given.
    pub text: String,
    /// The prefix the id should have had.
    pub prefix: &'static str,
}

/// What every id type offers, for code written once for all of them (a list's cursor).
pub trait ObjectId: Sized + fmt::Display + AsRef<str> {
    /// The prefix, without its underscore.
    const PREFIX: &'static str;

    /// The id `text` names, if it has the shape of one.
    fn parse(text: &str) -> Result<Self, NotAnId>;
}

/// Declares an id type: its prefix, generation, parsing, and its text form on the wire and in
/// the database.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident = $prefix:literal) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type,
        )]
        #[serde(try_from = "String", into = "String")]
        #[sqlx(transparent)]
        pub struct $name(String);

        impl $name {
            /// The prefix, without its underscore.
            pub const PREFIX: &'static str = $prefix;

            /// A fresh id.
            pub fn generate() -> Self {
                Self(new_id($prefix))
            }

            /// The id `text` names, if it has the shape of one ([`is_well_formed`]).
            pub fn parse(text: &str) -> Result<Self, NotAnId> {
                if is_well_formed(text, $prefix) {
                    Ok(Self(text.to_owned()))
                } else {
                    Err(NotAnId { text: text.to_owned(), prefix: $prefix })
                }
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl ObjectId for $name {
            const PREFIX: &'static str = $prefix;

            fn parse(text: &str) -> Result<Self, NotAnId> {
                $name::parse(text)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// An id reads as its text wherever text is wanted (a log field, a message, a processor
        /// request); the other way, text becomes an id only through `parse`.
        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = NotAnId;

            fn from_str(text: &str) -> Result<Self, NotAnId> {
                Self::parse(text)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NotAnId;

            fn try_from(text: String) -> Result<Self, NotAnId> {
                if is_well_formed(&text, $prefix) {
                    Ok(Self(text))
                } else {
                    Err(NotAnId { text, prefix: $prefix })
                }
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

id_type! {
    /// An account, `acct_…`.
    AccountId = "acct"
}

id_type! {
    /// An API key, `key_…`: names a key without revealing it.
    ApiKeyId = "key"
}

id_type! {
    /// A payment, `pay_…`.
    PaymentId = "pay"
}

id_type! {
    /// A refund, `re_…`.
    RefundId = "re"
}

id_type! {
    /// An event of ours, `evt_…` (the processor's events have ids of the same shape, but they
    /// are its ids, and stay text).
    EventId = "evt"
}

id_type! {
    /// A webhook endpoint, `we_…`.
    WebhookEndpointId = "we"
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn ids_carry_their_prefix_and_are_url_safe() {
        let id = PaymentId::generate();
        assert!(id.as_str().starts_with("pay_"));
        assert_eq!(id.as_str().len(), "pay_".len() + ID_RANDOM_CHARS);
        assert!(id.as_str()[4..].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn only_ids_of_the_right_shape_are_well_formed() {
        assert!(is_well_formed(PaymentId::generate().as_str(), "pay"));
        assert!(is_well_formed("pay_123", "pay"));
        for id in ["pay_", "pay", "re_123", "pay_a\0b", "pay_a-b", "pay_\u{e9}", "xpay_1"] {
            assert!(!is_well_formed(id, "pay"), "{id:?}");
            assert!(PaymentId::parse(id).is_err(), "{id:?}");
        }
        assert!(!is_well_formed(&format!("pay_{}", "a".repeat(65)), "pay"));
    }

    #[test]
    fn two_ids_differ() {
        assert_ne!(PaymentId::generate(), PaymentId::generate());
    }

    #[test]
    fn an_id_is_its_text_in_json_and_json_holds_only_ids_of_its_type() {
        let id = RefundId::parse("re_123").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""re_123""#);
        assert_eq!(serde_json::from_str::<RefundId>(r#""re_123""#).unwrap(), id);
        for wrong in [r#""pay_123""#, r#""re_""#, r#""re_1-2""#, "12"] {
            assert!(serde_json::from_str::<RefundId>(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn an_id_parses_from_text_of_its_own_type_only() {
        assert_eq!("acct_1".parse::<AccountId>().unwrap().as_str(), "acct_1");
        let err = "pay_1".parse::<AccountId>().unwrap_err();
        assert_eq!(err.prefix, "acct");
        assert!(err.to_string().contains("`acct_…`"), "{err}");
    }
}
