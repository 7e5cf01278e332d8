//! Downstream idempotency keys, derived from our own records.
//!
//! The key sent to the processor is built from the id of a local record that an earlier phase
//! committed, and the action: `pay_…/charge`, `re_…/refund`, and for the actions a payment can be
//! asked for more than once, the operation's own key record too: `pay_…/capture/k<key id>`,
//! `pay_…/cancel/k<key id>` (the idempotency key's row, stored by the operation's first phase).
//! A capture refused by the processor leaves the payment awaiting capture; a second capture, under
//! another idempotency key and perhaps with another amount, is a new request to the processor,
//! which a key per payment would have made a replay of the first refusal, or an idempotency
//! error when the amount differs (a reused key, which reconciliation must then explain). So it is
//! - **stable**: every retry, takeover and completer run of the same operation sends the same key,
//!   and the processor answers with the original object instead of acting twice;
//! - **unique across accounts**: our ids are random and global, so two accounts that happen to use
//!   the same client key still send different downstream keys;
//! - **never the client's key**: the client's key is theirs, scoped to their account, and may
//!   contain anything; it must not leak to a third party nor collide there.
//!
//! A key has generations. The first is the bare key; when the processor can no longer tell us
//! what a key did (it forgot the key, or refuses our retry) and a lookup proves that nothing was
//! done under it, the operation moves to the next generation (`pay_…/charge/2`), recorded before
//! the call, so two generations are never in flight.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An `Idempotency-Key` for the processor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    /// The key for creating the charge of payment `payment_id`.
    pub fn charge(payment_id: &str) -> Self {
        Self::derive(payment_id, "charge")
    }

    /// The key for capturing the charge of payment `payment_id`, by the operation whose
    /// idempotency key is the row `key_id`.
    pub fn capture(payment_id: &str, key_id: i64) -> Self {
        Self::derive(payment_id, &format!("capture/k{key_id}"))
    }

    /// The key for releasing the authorization of payment `payment_id` (a cancel), by the
    /// operation whose idempotency key is the row `key_id`.
    pub fn cancel(payment_id: &str, key_id: i64) -> Self {
        Self::derive(payment_id, &format!("cancel/k{key_id}"))
    }

    /// The key for canceling payment `payment_id` when its customer's authentication expired
    /// (the worker's authentication job: one per payment, whichever runner sends it).
    pub fn expiry(payment_id: &str) -> Self {
        Self::derive(payment_id, "expire")
    }

    /// The key for closing the PaymentIntent of payment `payment_id` once it was recorded
    /// `failed` (a failed authentication leaves it open to be confirmed again).
    pub fn close(payment_id: &str) -> Self {
        Self::derive(payment_id, "close")
    }

    /// The key for creating refund `refund_id` at the processor.
    pub fn refund(refund_id: &str) -> Self {
        Self::derive(refund_id, "refund")
    }

    fn derive(record_id: &str, action: &str) -> Self {
        Self(format!("{record_id}/{action}"))
    }

    /// The key of generation `generation` (1 is this key itself): `…/charge/2` and so on.
    pub fn generation(&self, generation: u32) -> Self {
        let base = self.base();
        if generation <= 1 { Self(base.to_owned()) } else { Self(format!("{base}/{generation}")) }
    }

    /// Which generation this key is (1 for a key without a suffix).
    pub fn generation_number(&self) -> u32 {
        match self.0.rsplit_once('/') {
            Some((_, last)) => last.parse().unwrap_or(1),
            None => 1,
        }
    }

    /// The key without its generation suffix.
    fn base(&self) -> &str {
        match self.0.rsplit_once('/') {
            Some((base, last)) if last.parse::<u32>().is_ok() => base,
            _ => &self.0,
        }
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_differ_by_record_and_action() {
        // Stable: the key a retry derives is the one an earlier attempt stored (a bare string).
        let stored = serde_json::from_value::<DownstreamKey>(serde_json::json!("pay_1/charge"));
        assert_eq!(stored.ok(), Some(DownstreamKey::charge("pay_1")));
        assert_eq!(DownstreamKey::charge("pay_1").as_str(), "pay_1/charge");
        assert_ne!(DownstreamKey::charge("pay_1"), DownstreamKey::charge("pay_2"));
        assert_ne!(DownstreamKey::charge("pay_1"), DownstreamKey::capture("pay_1", 7));
        assert_ne!(DownstreamKey::capture("pay_1", 7), DownstreamKey::cancel("pay_1", 7));
        assert_eq!(DownstreamKey::refund("re_9").as_str(), "re_9/refund");
    }

    #[test]
    fn each_capture_or_cancel_of_a_payment_has_its_own_key_with_generations() {
        let first = DownstreamKey::capture("pay_1", 7);
        assert_eq!(first.as_str(), "pay_1/capture/k7");
        assert_eq!(first, DownstreamKey::capture("pay_1", 7), "stable for one operation");
        assert_ne!(first, DownstreamKey::capture("pay_1", 8), "another operation, another key");
        assert_eq!(DownstreamKey::cancel("pay_1", 8).as_str(), "pay_1/cancel/k8");
        // The operation's part is not a number, so it is never read as a generation.
        assert_eq!(first.generation_number(), 1);
        let second = first.generation(2);
        assert_eq!(second.as_str(), "pay_1/capture/k7/2");
        assert_eq!(second.generation_number(), 2);
        assert_eq!(second.generation(1), first);
    }

    #[test]
    fn generations_count_from_the_bare_key() {
        let first = DownstreamKey::charge("pay_1");
        assert_eq!(first.generation_number(), 1);
        let second = first.generation(2);
        assert_eq!(second.as_str(), "pay_1/charge/2");
        assert_eq!(second.generation_number(), 2);
        assert_eq!(second.generation(3).as_str(), "pay_1/charge/3");
        assert_eq!(second.generation(1), first);
        assert_eq!(serde_json::to_value(&second).ok(), Some(serde_json::json!("pay_1/charge/2")));
    }
}
