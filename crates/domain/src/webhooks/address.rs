//! Which URLs an endpoint may have and which addresses a delivery may reach ([`AddressRule`]): no
//! server-side request forgery into private, link-local or loopback addresses.

use std::net::IpAddr;

use super::URL_MAX_CHARS;
use crate::DomainError;

/// Which destination addresses a delivery may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRule {
    /// Loopback addresses allowed (local runs and tests).
    pub allow_loopback: bool,
}

impl AddressRule {
    /// Whether a delivery may connect to `ip`. Refused always: unspecified, private, link-local
    /// (cloud metadata services live there), shared, multicast, broadcast, documentation and
    /// unique-local addresses; loopback unless allowed. An IPv4-mapped IPv6 address is judged
    /// as the IPv4 address it maps.
    pub fn permits(self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => {
                let [a, b, ..] = v4.octets();
                if v4.is_loopback() {
                    return self.allow_loopback;
                }
                !(v4.is_unspecified()
                    || v4.is_private()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_broadcast()
                    || v4.is_documentation()
                    || a == 0
                    || (a == 100 && (64..128).contains(&b)) // shared address space (RFC 6598)
                    || a >= 240)
            }
            IpAddr::V6(v6) => {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return self.permits(IpAddr::V4(v4));
                }
                if v6.is_loopback() {
                    return self.allow_loopback;
                }
                let first = v6.segments()[0];
                !(v6.is_unspecified()
                    || v6.is_multicast()
                    || (first & 0xfe00) == 0xfc00 // unique local
                    || (first & 0xffc0) == 0xfe80) // link-local
            }
        }
    }

    /// Checks a URL a merchant registers: `http` or `https`, a host, no credentials, and, when
    /// the host is an address, one this rule permits. Names are resolved and checked again at
    /// each delivery (a name can change what it points to).
    pub fn check_url(self, url: &str) -> Result<url::Url, DomainError> {
        let invalid =
            |message: &str| DomainError::Invalid { param: "url", message: message.into() };
        if url.chars().count() > URL_MAX_CHARS {
            return Err(invalid(&format!("`url` must be at most {URL_MAX_CHARS} characters.")));
        }
        let parsed = url::Url::parse(url).map_err(|_| invalid("`url` must be an absolute URL."))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("`url` must be an `http` or `https` URL."));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(invalid("`url` must not carry credentials."));
        }
        let refused = || {
            invalid(
                "`url` points at a private, loopback or otherwise internal address; webhooks are \
                 delivered only to public addresses.",
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
