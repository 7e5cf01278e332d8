//! Which URLs an endpoint may have and which addresses a delivery may reach ([`AddressRule`]): no
//! server-side request forgery into anything but the public Internet.
//!
//! The rule allows, where a deny-list would refuse: an address is permitted only when the IANA
//! special-purpose registries mark it globally reachable (the ranges, and why each is there, are
//! in `special`). An IPv6 address that carries an IPv4 one (IPv4-mapped `::ffff:a.b.c.d`, NAT64
//! `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::/48`) is judged by that IPv4 address; the other
//! such forms (IPv4-compatible `::a.b.c.d`, Teredo `2001::/32`, local-use NAT64
//! `64:ff9b:1::/48`) are refused whole. On top of the registries: the cloud providers' host
//! services that look public (Azure's 168.63.129.16), and the ranges the operator lists in
//! `webhooks.deny_ranges`.

use std::net::IpAddr;

use ipnet::IpNet;

use super::URL_MAX_CHARS;
use super::special::{self, Embedded};
use crate::DomainError;
use crate::text::{self, Lines};

/// Which destination addresses a delivery may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressRule {
    /// Loopback addresses allowed (local runs and tests): `127.0.0.0/8`, `::1` and their
    /// IPv4-mapped forms, never one forwarded by NAT64 or 6to4 (that is another machine's).
    pub allow_loopback: bool,
    /// Ranges refused on top of the registries (`webhooks.deny_ranges`): an address in one is
    /// refused, and so is an IPv6 address whose embedded IPv4 address is in one.
    pub deny_ranges: Vec<IpNet>,
}

impl AddressRule {
    /// Whether a delivery may connect to `ip`: only when it is globally reachable (its embedded
    /// IPv4 address judged instead, for the forms that carry one), or loopback while loopback is
    /// allowed; and never a provider's host service or an address in `deny_ranges`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let embedded = match ip {
            IpAddr::V4(_) => None,
            IpAddr::V6(v6) => special::embedded_ipv4(v6),
        };
        if self.denied(ip) || embedded.is_some_and(|e| self.denied(IpAddr::V4(e.ipv4()))) {
            return false;
        }
        match (ip, embedded) {
            (IpAddr::V4(v4), _) | (_, Some(Embedded::Mapped(v4))) => {
                special::ipv4_is_global(v4) || (self.allow_loopback && v4.is_loopback())
            }
            (_, Some(Embedded::Forwarded(v4))) => special::ipv4_is_global(v4),
            (IpAddr::V6(v6), None) => {
                special::ipv6_is_global(v6) || (self.allow_loopback && v6.is_loopback())
            }
        }
    }

    /// A provider's host service, or a range the operator refused.
    fn denied(&self, ip: IpAddr) -> bool {
        special::is_host_service(ip) || self.deny_ranges.iter().any(|range| range.contains(&ip))
    }

    /// Checks a URL a merchant registers: `http` or `https`, a host, no credentials, and, when
    /// the host is an address, one this rule permits. Names are resolved and checked again at
    /// each delivery (a name can change what it points to).
    pub fn check_url(&self, url: &str) -> Result<url::Url, DomainError> {
        let invalid =
            |message: &str| DomainError::Invalid { param: "url", message: message.into() };
        if url.chars().count() > URL_MAX_CHARS {
            return Err(invalid(&format!("`url` must be at most {URL_MAX_CHARS} characters.")));
        }
        // The parser would silently drop a tab, a line break or an invisible character of the host
        // and percent-encode the rest: refused instead, as in every text a client writes.
        text::check("url", url, Lines::Refused)?;
        let parsed = url::Url::parse(url).map_err(|_| invalid("`url` must be an absolute URL."))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("`url` must be an `http` or `https` URL."));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(invalid("`url` must not carry credentials."));
        }
        let refused = || {
            invalid(
                "`url` points at an address that is not on the public Internet (private, \
                 loopback, link-local, reserved or otherwise special-purpose, or refused by the \
                 operator); webhooks are delivered only to public addresses.",
            )
        };
        match parsed.host() {
            None => return Err(invalid("`url` must name a host.")),
            Some(url::Host::Ipv4(v4)) if !self.permits(IpAddr::V4(v4)) => return Err(refused()),
            Some(url::Host::Ipv6(v6)) if !self.permits(IpAddr::V6(v6)) => return Err(refused()),
            Some(url::Host::Domain(name))
                if !self.allow_loopback
                    && (name.eq_ignore_ascii_case("localhost")
                        || name.to_ascii_lowercase().ends_with(".localhost")) =>
            {
                return Err(refused());
            }
            Some(_) => {}
        }
        Ok(parsed)
    }
}
