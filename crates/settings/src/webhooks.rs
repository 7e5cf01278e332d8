//! `[webhooks]`: which URLs an account may register, and how deliveries to them are timed.

use serde::Deserialize;

use crate::AddressRanges;

/// `[webhooks]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Allow endpoints on loopback addresses (127.0.0.0/8, ::1, `localhost`), for local runs and
    /// tests. Every other address that is not globally reachable is refused regardless.
    pub allow_loopback: bool,
    /// Address ranges refused on top of those that are not globally reachable (the operator's
    /// own public ranges, say): a list in the file, or one string of ranges separated by commas
    /// or spaces in the environment. A bare address is a range of one.
    pub deny_ranges: AddressRanges,
    /// The longest one delivery may take, connection included; past it the attempt failed.
    pub timeout_ms: u64,
    /// First delay before a failed delivery is tried again; doubles per attempt, with jitter.
    pub backoff_base_ms: u64,
    /// The longest delay between two attempts.
    pub backoff_cap_ms: u64,
    /// A delivery still failing this long after its event was created is dead-lettered.
    pub horizon_hours: u32,
}
