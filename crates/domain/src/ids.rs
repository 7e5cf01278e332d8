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
    fn two_ids_differ() {
        assert_ne!(new_id("pay"), new_id("pay"));
    }
}
