//! Public object ids: a type prefix and random characters.
//!
//! Ids are unguessable (no sequence numbers leak how busy an account is) and URL-safe. 24
//! alphanumeric characters carry about 143 bits, so collisions are not a practical concern; the
//! primary keys would reject one anyway.

use rand::Rng;
use rand::distributions::Alphanumeric;

/// How many random characters follow the prefix.
const ID_RANDOM_CHARS: usize = 24;

/// A fresh id such as `acct_3fQ9…` for the given prefix (without the underscore).
pub fn new_id(prefix: &str) -> String {
    with_random_suffix(prefix, ID_RANDOM_CHARS)
}

/// The most characters an id may have after its prefix: generous beside the 24 generated, so
/// that ids made elsewhere (fixtures, imports) still fit, and small enough to bound a lookup.
pub const ID_MAX_SUFFIX_CHARS: usize = 64;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_prefix_and_are_url_safe() {
        let id = new_id("pay");
        assert!(id.starts_with("pay_"));
        assert_eq!(id.len(), "pay_".len() + ID_RANDOM_CHARS);
        assert!(id[4..].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn only_ids_of_the_right_shape_are_well_formed() {
        assert!(is_well_formed(&new_id("pay"), "pay"));
        assert!(is_well_formed("pay_123", "pay"));
        for id in ["pay_", "pay", "re_123", "pay_a\0b", "pay_a-b", "pay_\u{e9}", "xpay_1"] {
            assert!(!is_well_formed(id, "pay"), "{id:?}");
        }
        assert!(!is_well_formed(&format!("pay_{}", "a".repeat(65)), "pay"));
    }

    #[test]
    fn two_ids_differ() {
        assert_ne!(new_id("pay"), new_id("pay"));
    }
}
