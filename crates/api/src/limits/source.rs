//! Where a request comes from: the client's address ([`ClientAddress`], resolved once per request
//! at the edge) and what the per-address limits count it as ([`SourceKey`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address of the client a request comes from: the TCP peer, or, when the peer is a trusted
/// proxy, the client its forwarding header names (`forwarded::ProxyTrust`). In the request's
/// extensions, put there by the edge; absent from a request that reached the router some other
/// way than the listener (a test's `oneshot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(IpAddr);

impl ClientAddress {
    /// The client at `address`; an IPv4-mapped IPv6 address is taken as the IPv4 address it maps.
    pub fn new(address: IpAddr) -> Self {
        Self(address.to_canonical())
    }

    /// The address.
    pub fn ip(self) -> IpAddr {
        self.0
    }

    /// What the per-address limits count this client as.
    pub fn source(self) -> SourceKey {
        SourceKey::of(self.0)
    }
}

impl fmt::Display for ClientAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One source as the per-address limits count it: an IPv4 address, or the /64 network of an IPv6
/// one. A host is routinely given a whole /64 (SLAAC, privacy addresses), so counting IPv6 by full
/// address would give it 2^64 fresh buckets; a /64 is the smallest block a site is assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKey {
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// The upper 64 bits of an IPv6 address: its /64.
    V6Net(u64),
}

impl SourceKey {
    /// The source `address` belongs to; an IPv4-mapped IPv6 address (`::ffff:1.2.3.4`) is the
    /// IPv4 address it maps.
    pub fn of(address: IpAddr) -> Self {
        match address.to_canonical() {
            IpAddr::V4(v4) => Self::V4(v4),
            IpAddr::V6(v6) => Self::V6Net((v6.to_bits() >> 64) as u64),
        }
    }
}

impl fmt::Display for SourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V4(v4) => v4.fmt(f),
            Self::V6Net(net) => write!(f, "{}/64", Ipv6Addr::from_bits(u128::from(*net) << 64)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic in a test is a failed test
mod tests {
    use super::*;

    fn key(address: &str) -> SourceKey {
        SourceKey::of(address.parse().unwrap())
    }

    #[test]
    fn a_64_rotating_through_its_addresses_is_one_source() {
        let first = key("2001:db8:1:2::1");
        for address in
            ["2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2:a:b:c:d"]
        {
            assert_eq!(key(address), first, "{address}");
        }
        assert_eq!(first.to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn different_64s_are_different_sources() {
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db9:1:2::1"));
    }

    #[test]
    fn an_ipv4_address_is_a_source_of_its_own() {
        assert_ne!(key("192.0.2.1"), key("192.0.2.2"));
        assert_eq!(key("192.0.2.1").to_string(), "192.0.2.1");
    }

    #[test]
    fn an_ipv4_mapped_address_is_the_ipv4_address() {
        assert_eq!(key("::ffff:1.2.3.4"), key("1.2.3.4"));
        assert_ne!(key("::ffff:1.2.3.4"), key("::ffff:1.2.3.5"));
        let mapped = ClientAddress::new("::ffff:1.2.3.4".parse().unwrap());
        assert_eq!(mapped.to_string(), "1.2.3.4");
        assert_eq!(mapped.source(), key("1.2.3.4"));
    }
}
