//! `[webhooks]`: which URLs an account may register, and how deliveries to them are timed.

use std::fmt;

use ipnet::IpNet;
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

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
    #[serde(deserialize_with = "deny_ranges")]
    pub deny_ranges: Vec<IpNet>,
    /// The longest one delivery may take, connection included; past it the attempt failed.
    pub timeout_ms: u64,
    /// First delay before a failed delivery is tried again; doubles per attempt, with jitter.
    pub backoff_base_ms: u64,
    /// The longest delay between two attempts.
    pub backoff_cap_ms: u64,
    /// A delivery still failing this long after its event was created is dead-lettered.
    pub horizon_hours: u32,
}

/// `webhooks.deny_ranges`: a list of ranges (the file), or one string of them (an environment
/// variable, which the settings read as text).
fn deny_ranges<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    struct Ranges;

    impl<'de> Visitor<'de> for Ranges {
        type Value = Vec<IpNet>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of address ranges, or one string of them separated by commas")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            text.split([',', ' ', '\t', '\n'])
                .filter(|range| !range.is_empty())
                .map(|range| parse_range(range).map_err(E::custom))
                .collect()
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut ranges = Vec::new();
            while let Some(range) = seq.next_element::<String>()? {
                ranges.push(parse_range(range.trim()).map_err(de::Error::custom)?);
            }
            Ok(ranges)
        }
    }

    deserializer.deserialize_any(Ranges)
}

/// `10.0.0.0/8`, `fd00::/8`, or a bare address (a range of one).
fn parse_range(text: &str) -> Result<IpNet, String> {
    let parsed = match text.parse::<IpNet>() {
        Ok(range) => Ok(range),
        Err(_) => text.parse::<std::net::IpAddr>().map(IpNet::from),
    };
    parsed.map(|range| range.trunc()).map_err(|_| {
        format!(
            "webhooks.deny_ranges (PAYMENTS__WEBHOOKS__DENY_RANGES): `{text}` is not an address \
             range such as 10.0.0.0/8 or fd00::/8"
        )
    })
}
