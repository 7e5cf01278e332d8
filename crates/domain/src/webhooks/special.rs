//! The IANA special-purpose address registries, as the address rule reads them: which addresses
//! are globally reachable, which IPv6 forms carry an IPv4 address to judge instead, and the cloud
//! providers' host services that look like public addresses.
//!
//! Sources: the [IPv4](https://www.iana.org/assignments/iana-ipv4-special-registry/) and
//! [IPv6](https://www.iana.org/assignments/iana-ipv6-special-registry/) special-purpose address
//! registries, with the multicast and reserved blocks those registries leave to others. Every
//! range whose "Globally Reachable" is not `True` is refused. The few `True` exceptions inside a
//! refused block (`192.0.0.9/32` and `192.0.0.10/32` in `192.0.0.0/24`; `2001:1::1/128`,
//! `2001:3::/32`, `2001:20::/28` and the others in `2001::/23`) are refused with their block:
//! they are anycast relays and identifiers, never a merchant's webhook receiver, and a rule that
//! refuses a little too much is the safe side for a payments API.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix_len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix_len)
}

const fn v6(first: u16, second: u16, prefix_len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(Ipv6Addr::new(first, second, 0, 0, 0, 0, 0, 0), prefix_len)
}

/// IPv4 ranges that are not globally reachable.
const IPV4_NOT_GLOBAL: &[Ipv4Net] = &[
    v4(0, 0, 0, 0, 8),       // "this network" (RFC 791), 0.0.0.0 among it
    v4(10, 0, 0, 0, 8),      // private (RFC 1918)
    v4(100, 64, 0, 0, 10),   // shared address space, carrier-grade NAT (RFC 6598)
    v4(127, 0, 0, 0, 8),     // loopback (RFC 1122): allowed apart, by `allow_loopback`
    v4(169, 254, 0, 0, 16),  // link-local (RFC 3927): the cloud metadata services live here
    v4(172, 16, 0, 0, 12),   // private
    v4(192, 0, 0, 0, 24),    // IETF protocol assignments (RFC 6890): DS-Lite, NAT64 discovery, …
    v4(192, 0, 2, 0, 24),    // TEST-NET-1, documentation (RFC 5737)
    v4(192, 88, 99, 0, 24),  // 6to4 relay anycast, deprecated (RFC 7526)
    v4(192, 168, 0, 0, 16),  // private
    v4(198, 18, 0, 0, 15),   // benchmarking (RFC 2544)
    v4(198, 51, 100, 0, 24), // TEST-NET-2
    v4(203, 0, 113, 0, 24),  // TEST-NET-3
    v4(224, 0, 0, 0, 4),     // multicast (RFC 5771)
    v4(240, 0, 0, 0, 4),     // reserved (RFC 1112), 255.255.255.255 (limited broadcast) among it
];

/// The one block of global unicast IPv6 addresses (RFC 4291): everything outside it is not
/// globally reachable (`::`, `::1`, the IPv4-compatible `::/96`, `64:ff9b:1::/48`, `100::/64`,
/// `5f00::/16`, `fc00::/7`, `fe80::/10`, `fec0::/10`, `ff00::/8`, …), but for the forms decoded
/// by [`embedded_ipv4`] first.
const IPV6_GLOBAL_UNICAST: Ipv6Net = v6(0x2000, 0, 3);

/// IPv6 ranges inside the global unicast block that are not globally reachable.
const IPV6_NOT_GLOBAL: &[Ipv6Net] = &[
    v6(0x2001, 0, 23), // IETF protocol assignments (RFC 2928): Teredo 2001::/32 among them
    v6(0x2001, 0xdb8, 32), // documentation (RFC 3849)
    v6(0x2002, 0, 16), // 6to4 (RFC 3056): judged by the IPv4 address it embeds
    v6(0x3fff, 0, 20), // documentation (RFC 9637)
];

/// Host services of cloud providers at addresses no registry marks: refused like the rest.
/// Their other services already sit in refused ranges: the metadata services of AWS, GCP, Azure
/// and others at 169.254.169.254 (link-local), AWS's `fd00:ec2::254` (unique local), Alibaba's
/// 100.100.100.200 (shared address space).
const HOST_SERVICES: &[IpNet] = &[
    // Azure's WireServer and DNS (168.63.129.16): a VM's own agent and health probe channel.
    IpNet::V4(v4(168, 63, 129, 16, 32)),
];

/// An IPv4 address carried in an IPv6 one, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Embedded {
    /// IPv4-mapped, `::ffff:a.b.c.d` (RFC 4291): a dual-stack socket connects to the IPv4
    /// address itself, this machine's loopback included.
    Mapped(Ipv4Addr),
    /// The NAT64 well-known prefix `64:ff9b::a.b.c.d` (RFC 6052), or 6to4
    /// `2002:AABB:CCDD::/48` (RFC 3056): a translator or relay elsewhere forwards to the IPv4
    /// address, so it is never this machine's loopback.
    Forwarded(Ipv4Addr),
}

impl Embedded {
    /// The IPv4 address carried.
    pub(super) fn ipv4(self) -> Ipv4Addr {
        match self {
            Self::Mapped(v4) | Self::Forwarded(v4) => v4,
        }
    }
}

/// The IPv4 address `ip` carries, in the forms judged by that address. Not decoded, so refused
/// as not global unicast: the IPv4-compatible `::a.b.c.d` (deprecated by RFC 4291, routed by no
/// current stack), the local-use NAT64 prefix `64:ff9b:1::/48` (a network's own translator, to
/// anything), and Teredo `2001::/32` (inside `2001::/23`; its relays are gone, and it carries two
/// IPv4 addresses, the server's and the client's, obscured).
pub(super) fn embedded_ipv4(ip: Ipv6Addr) -> Option<Embedded> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(Embedded::Mapped(v4));
    }
    let [s0, s1, s2, s3, s4, s5, s6, s7] = ip.segments();
    let pair = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    match (s0, s1, s2, s3, s4, s5) {
        (0x64, 0xff9b, 0, 0, 0, 0) => Some(Embedded::Forwarded(pair(s6, s7))),
        (0x2002, ..) => Some(Embedded::Forwarded(pair(s1, s2))),
        _ => None,
    }
}

/// Whether the registries mark `ip` globally reachable.
pub(super) fn ipv4_is_global(ip: Ipv4Addr) -> bool {
    !IPV4_NOT_GLOBAL.iter().any(|range| range.contains(&ip))
}

/// Whether the registries mark `ip` globally reachable, as an IPv6 address (the forms of
/// [`embedded_ipv4`] are judged by their IPv4 address instead, and are not global here).
pub(super) fn ipv6_is_global(ip: Ipv6Addr) -> bool {
    IPV6_GLOBAL_UNICAST.contains(&ip) && !IPV6_NOT_GLOBAL.iter().any(|range| range.contains(&ip))
}

/// Whether `ip` is a cloud provider's host service.
pub(super) fn is_host_service(ip: IpAddr) -> bool {
    HOST_SERVICES.iter().any(|range| range.contains(&ip))
}
