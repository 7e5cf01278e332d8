//! The client behind a proxy: `X-Forwarded-For` or RFC 7239's `Forwarded`, believed only from
//! the peers of `http.trusted_proxies` and only in the header of `http.forwarded_header`.
//!
//! Each proxy on the way appends the address it received the request from, so the chain reads
//! left to right from the client (as it claims) to the last proxy; anything left of the first
//! proxy we trust was written by the client and proves nothing. The client is therefore the
//! right-most address that is not itself a trusted proxy (the left-most, if every one is). An
//! element that must be judged and cannot be read (`unknown`, an obfuscated name, garbage) gives
//! up on the header and takes the peer: a proxy that cannot say who its client is has not said
//! it. Elements left of the one taken are never read, so nothing the client puts there changes
//! the answer. Elements are split at every `,` and `;` with no regard for quoting: no address has
//! either, and a quote left open by the client cannot swallow what the proxies appended.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::http::{HeaderMap, HeaderName, header};
use payments_settings::{AddressRanges, ForwardedHeader};

use super::ClientAddress;

/// `X-Forwarded-For`, which `http` does not name.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Which peers may name the client, and in which header.
#[derive(Debug, Clone, Default)]
pub struct ProxyTrust {
    proxies: AddressRanges,
    header: ForwardedHeader,
}

impl ProxyTrust {
    /// Believes `header` from the peers in `proxies`.
    pub fn new(proxies: AddressRanges, header: ForwardedHeader) -> Self {
        Self { proxies, header }
    }

    /// Whether `peer` is a trusted proxy.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.proxies.contains(peer)
    }

    /// The client a request from `peer` with `headers` comes from.
    pub fn client_address(&self, peer: IpAddr, headers: &HeaderMap) -> ClientAddress {
        let peer = ClientAddress::new(peer);
        if !self.proxies.contains(peer.ip()) {
            return peer;
        }
        self.forwarded_client(headers).unwrap_or(peer)
    }

    /// The right-most address of the chain that is not a trusted proxy, or the left-most if all
    /// are; `None` without a chain, or when the element to judge cannot be read.
    fn forwarded_client(&self, headers: &HeaderMap) -> Option<ClientAddress> {
        let name = match self.header {
            ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => &header::FORWARDED,
        };
        // A header on several lines is one list, in the order of the lines.
        let elements = headers
            .get_all(name)
            .iter()
            .rev()
            .flat_map(|value| value.as_bytes().split(|byte| *byte == b',').rev());
        let mut left_most = None;
        for element in elements {
            let node = match self.header {
                ForwardedHeader::XForwardedFor => element,
                ForwardedHeader::Forwarded => for_parameter(element)?,
            };
            let address = ClientAddress::new(node_address(node)?);
            if !self.proxies.contains(address.ip()) {
                return Some(address);
            }
            left_most = Some(address);
        }
        left_most
    }
}

/// The value of the `for` parameter of one `Forwarded` element (`for=…;proto=…;by=…`), without
/// its quotes.
fn for_parameter(element: &[u8]) -> Option<&[u8]> {
    element.split(|byte| *byte == b';').find_map(|pair| {
        let at = pair.iter().position(|byte| *byte == b'=')?;
        let (name, value) = (pair[..at].trim_ascii(), pair[at + 1..].trim_ascii());
        if !name.eq_ignore_ascii_case(b"for") {
            return None;
        }
        Some(value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(value))
    })
}

/// The address of a node: `192.0.2.1`, `2001:db8::1`, either with a port (`192.0.2.1:4711`,
/// `[2001:db8::1]:4711`), or `[2001:db8::1]`. Anything else (`unknown`, `_hidden`) is `None`.
fn node_address(node: &[u8]) -> Option<IpAddr> {
    let node = std::str::from_utf8(node.trim_ascii()).ok()?;
    if let Ok(address) = node.parse::<IpAddr>() {
        return Some(address);
    }
    if let Ok(address) = node.parse::<SocketAddr>() {
        return Some(address.ip());
    }
    let bracketed = node.strip_prefix('[')?.strip_suffix(']')?;
    bracketed.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic in a test is a failed test
mod tests {
    use super::*;

    fn trust(ranges: &[&str], header: ForwardedHeader) -> ProxyTrust {
        ProxyTrust::new(AddressRanges::parse(ranges.iter().copied()).unwrap(), header)
    }

    /// The client of a request from `peer` with the header lines `lines`.
    fn client(trust: &ProxyTrust, peer: &str, name: &str, lines: &[&str]) -> String {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), line.parse().unwrap());
        }
        trust.client_address(peer.parse().unwrap(), &headers).to_string()
    }

    const XFF: &str = "x-forwarded-for";

    #[test]
    fn a_spoofed_x_forwarded_for_from_an_untrusted_peer_is_ignored() {
        let none = ProxyTrust::default();
        assert_eq!(client(&none, "198.51.100.9", XFF, &["203.0.113.7"]), "198.51.100.9");
        let lb = trust(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        assert_eq!(client(&lb, "198.51.100.9", XFF, &["203.0.113.7"]), "198.51.100.9");
        assert_eq!(client(&lb, "198.51.100.9", XFF, &["10.0.0.1"]), "198.51.100.9");
    }

    #[test]
    fn from_a_trusted_proxy_the_client_it_names_is_used() {
        let lb = trust(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        assert_eq!(client(&lb, "10.1.2.3", XFF, &["203.0.113.7"]), "203.0.113.7");
        // What the client wrote itself, left of what the proxy appended, changes nothing.
        for spoofed in ["6.6.6.6, 203.0.113.7", "garbage, 203.0.113.7", "\"x;, 203.0.113.7"] {
            assert_eq!(client(&lb, "10.1.2.3", XFF, &[spoofed]), "203.0.113.7", "{spoofed}");
        }
        // A dual-stack listener sees the proxy as an IPv4-mapped address.
        assert_eq!(client(&lb, "::ffff:10.1.2.3", XFF, &["203.0.113.7"]), "203.0.113.7");
        assert_eq!(client(&lb, "10.1.2.3", XFF, &["::ffff:203.0.113.7"]), "203.0.113.7");
    }

    #[test]
    fn a_chain_of_trusted_hops_is_walked_to_the_client() {
        let lbs = trust(&["10.0.0.0/8", "2001:db8:ffff::/48"], ForwardedHeader::XForwardedFor);
        let chain = "6.6.6.6, 203.0.113.7, 10.0.0.2, 2001:db8:ffff::1";
        assert_eq!(client(&lbs, "10.0.0.3", XFF, &[chain]), "203.0.113.7");
        // The same chain on two lines, as a proxy that adds a line of its own sends it.
        let lines = ["6.6.6.6, 203.0.113.7", "10.0.0.2,2001:db8:ffff::1"];
        assert_eq!(client(&lbs, "10.0.0.3", XFF, &lines), "203.0.113.7");
        // Every hop trusted: the left-most is the client (a health check from inside).
        assert_eq!(client(&lbs, "10.0.0.3", XFF, &["10.0.0.9, 10.0.0.2"]), "10.0.0.9");
        // Ports, as some proxies write them.
        assert_eq!(client(&lbs, "10.0.0.3", XFF, &["203.0.113.7:4711"]), "203.0.113.7");
        assert_eq!(client(&lbs, "10.0.0.3", XFF, &["[2001:db8::1]:4711"]), "2001:db8::1");
    }

    #[test]
    fn the_forwarded_header_is_read_in_each_of_its_forms() {
        let lb = trust(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        let forwarded = "forwarded";
        assert_eq!(client(&lb, "10.0.0.1", forwarded, &["for=192.0.2.60"]), "192.0.2.60");
        assert_eq!(
            client(&lb, "10.0.0.1", forwarded, &[r#"for="[2001:db8::1]:4711""#]),
            "2001:db8::1"
        );
        assert_eq!(client(&lb, "10.0.0.1", forwarded, &[r#"For="[2001:db8::1]""#]), "2001:db8::1");
        let chain = r#"for=6.6.6.6, for=192.0.2.60;proto=https;by=10.0.0.1, for="10.0.0.2:80""#;
        assert_eq!(client(&lb, "10.0.0.1", forwarded, &[chain]), "192.0.2.60");
        let reordered = "proto=https; by=10.0.0.1 ;  for = 192.0.2.61 ";
        assert_eq!(client(&lb, "10.0.0.1", forwarded, &[reordered]), "192.0.2.61");
    }

    #[test]
    fn only_the_configured_header_is_read() {
        let xff = trust(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        assert_eq!(client(&xff, "10.0.0.1", "forwarded", &["for=192.0.2.60"]), "10.0.0.1");
        let forwarded = trust(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        assert_eq!(client(&forwarded, "10.0.0.1", XFF, &["192.0.2.60"]), "10.0.0.1");
    }

    #[test]
    fn a_missing_or_malformed_header_from_a_trusted_proxy_falls_back_to_the_peer() {
        let lb = trust(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        assert_eq!(client(&lb, "10.0.0.1", XFF, &[]), "10.0.0.1");
        for malformed in ["", "garbage", "203.0.113.7, unknown", "203.0.113.7,", "1.2.3.4.5"] {
            assert_eq!(client(&lb, "10.0.0.1", XFF, &[malformed]), "10.0.0.1", "{malformed}");
        }
        let lb = trust(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        for malformed in ["for=unknown", "for=_hidden", "proto=https", "for=[::1", "192.0.2.60"] {
            assert_eq!(client(&lb, "10.0.0.1", "forwarded", &[malformed]), "10.0.0.1");
        }
    }
}
