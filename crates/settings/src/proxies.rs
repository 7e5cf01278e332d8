//! `http.trusted_proxies` and `http.forwarded_header`: which peers may say, in a header, whom
//! they forward a request for, and in which header.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;

/// The address ranges of the proxies whose forwarding header is believed
/// (`http.trusted_proxies`). Empty by default: every peer is the client it appears to be, and
/// the headers are ignored. Written as a TOML list of CIDR ranges or single addresses, or, in the
/// environment, the same separated by commas (`10.0.0.0/8,2001:db8::/32`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// The ranges named by `entries` (CIDR ranges or single addresses), or what is wrong with the
    /// first that is neither.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut ranges = Vec::new();
        for entry in entries.into_iter().map(str::trim).filter(|entry| !entry.is_empty()) {
            let range = IpNet::from_str(entry)
                .or_else(|_| IpAddr::from_str(entry).map(IpNet::from))
                .map_err(|_| format!("`{entry}` is neither an IP address nor a CIDR range"))?;
            ranges.push(range);
        }
        Ok(Self(ranges))
    }

    /// Whether `address` is in one of the ranges. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
    /// how a dual-stack listener sees an IPv4 peer) is judged as the IPv4 address it maps.
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = address.to_canonical();
        self.0.iter().any(|range| range.contains(&address))
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de> Deserialize<'de> for TrustedProxies {
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
            Written::Text(text) => Self::parse(text.split(',')),
        };
        parsed.map_err(|reason| {
            serde::de::Error::custom(format!(
                "invalid setting `http.trusted_proxies` (environment variable \
                 PAYMENTS__HTTP__TRUSTED_PROXIES): {reason}"
            ))
        })
    }
}

/// The header a trusted proxy names the client in (`http.forwarded_header`). One, not both: a
/// proxy adds to the header it writes and passes the other on as the client sent it, so reading
/// the other would believe the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`, what most load balancers write.
    #[default]
    XForwardedFor,
    /// RFC 7239's `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}
