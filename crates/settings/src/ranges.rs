//! [`AddressRanges`]: a setting that names address ranges (`http.trusted_proxies`,
//! `webhooks.deny_ranges`).

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;

/// Address ranges: written as a TOML list of CIDR ranges or single addresses (a range of one),
/// or, in the environment, the same in one text separated by commas or spaces
/// (`10.0.0.0/8, 2001:db8::/32`). Empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressRanges(Vec<IpNet>);

impl AddressRanges {
    /// The ranges named by `entries` (CIDR ranges or single addresses; blanks skipped), or what
    /// is wrong with the first that is neither.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut ranges = Vec::new();
        for entry in entries.into_iter().map(str::trim).filter(|entry| !entry.is_empty()) {
            let range = IpNet::from_str(entry)
                .or_else(|_| IpAddr::from_str(entry).map(IpNet::from))
                .map_err(|_| format!("`{entry}` is neither an IP address nor a CIDR range"))?;
            ranges.push(range.trunc());
        }
        Ok(Self(ranges))
    }

    /// Whether `address` is in one of the ranges. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
    /// how a dual-stack listener sees an IPv4 peer) is judged as the IPv4 address it maps.
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = address.to_canonical();
        self.0.iter().any(|range| range.contains(&address))
    }

    /// Whether there is no range.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ranges.
    pub fn ranges(&self) -> &[IpNet] {
        &self.0
    }
}

impl<'de> Deserialize<'de> for AddressRanges {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// A list in the file, one text in the environment.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            List(Vec<String>),
            Text(String),
        }
        let parsed = match Written::deserialize(deserializer)? {
            Written::List(entries) => Self::parse(entries.iter().map(String::as_str)),
            Written::Text(text) => Self::parse(text.split([',', ' ', '\t', '\n'])),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}
