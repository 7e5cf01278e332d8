//! `[webhooks]`: which URLs an account may register, how deliveries to them are timed, how many
//! run at once, when a failing endpoint is paused or disabled, and the keys that seal the
//! endpoints' signing secrets at rest.

use secrecy::{ExposeSecret as _, SecretString};
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
    /// The longest the connection of a delivery may take (name resolution, TCP, TLS): a host
    /// that does not answer fails fast instead of holding a place for the whole `timeout_ms`.
    pub connect_timeout_ms: u64,
    /// Deliveries one worker runs at once.
    pub max_deliveries: u32,
    /// Deliveries to one account's endpoints run at once, by every worker together.
    pub max_deliveries_per_account: u32,
    /// Deliveries to one endpoint run at once, by every worker together.
    pub max_deliveries_per_endpoint: u32,
    /// An endpoint whose deliveries failed this many times in a row...
    pub pause_after_failures: u32,
    /// ...over at least this long is paused: its deliveries are deferred, not attempted.
    pub pause_after_minutes: u32,
    /// The first pause; then one delivery is tried, and each failed one doubles the pause, up to
    /// `backoff_cap_ms`.
    pub pause_ms: u64,
    /// An endpoint failing this long is disabled, with the event `webhook_endpoint.disabled`.
    pub disable_after_hours: u32,
    /// First delay before a failed delivery is tried again; doubles per attempt, with jitter.
    pub backoff_base_ms: u64,
    /// The longest delay between two attempts.
    pub backoff_cap_ms: u64,
    /// A delivery still failing this long after its event was created is dead-lettered.
    pub horizon_hours: u32,
    /// The key that seals every new endpoint's signing secret (64 hexadecimal digits, 32 bytes);
    /// empty: the API and the worker refuse to start. Never printed.
    pub sealing_key: SecretString,
    /// Keys that sealed secrets before `sealing_key` replaced them, still opened but never used
    /// to seal (the same form, separated by commas or spaces). Never printed.
    pub old_sealing_keys: SecretString,
}

/// A key that seals signing secrets: 32 bytes. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SealingKey(pub [u8; SEALING_KEY_BYTES]);

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealingKey(…)")
    }
}

/// The length of a sealing key, in bytes.
pub const SEALING_KEY_BYTES: usize = 32;

/// The sealing keys: the one that seals, and the old ones that still open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealingKeys {
    /// Seals new secrets, and opens what it sealed.
    pub current: SealingKey,
    /// Open what they sealed before.
    pub old: Vec<SealingKey>,
}

impl WebhookSettings {
    /// `sealing_key` and `old_sealing_keys` read (`None`: no `sealing_key` is set), or which of
    /// the two is not written as keys are, and why.
    pub(crate) fn read_sealing_keys(&self) -> Result<Option<SealingKeys>, (&'static str, String)> {
        let old = self
            .old_sealing_keys
            .expose_secret()
            .split([',', ' ', '\t', '\n'])
            .filter(|entry| !entry.trim().is_empty())
            .map(parse_key)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| ("webhooks.old_sealing_keys", reason))?;
        let current = self.sealing_key.expose_secret();
        if current.trim().is_empty() {
            if old.is_empty() {
                return Ok(None);
            }
            return Err((
                "webhooks.sealing_key",
                "must be set when webhooks.old_sealing_keys is: it is the key that seals".into(),
            ));
        }
        let current = parse_key(current).map_err(|reason| ("webhooks.sealing_key", reason))?;
        Ok(Some(SealingKeys { current, old }))
    }
}

/// A key written as 64 hexadecimal digits; the error never repeats the text.
fn parse_key(text: &str) -> Result<SealingKey, String> {
    let mut key = [0; SEALING_KEY_BYTES];
    hex::decode_to_slice(text.trim(), &mut key).map_err(|_| {
        "a key is 64 hexadecimal digits (32 bytes), e.g. from `openssl rand -hex 32`".to_owned()
    })?;
    Ok(SealingKey(key))
}
