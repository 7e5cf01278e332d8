//! Tests of the endpoints' rules: the signature's scheme, and the addresses and URLs refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;

const LIVE: AddressRule = AddressRule { allow_loopback: false };
const LOCAL: AddressRule = AddressRule { allow_loopback: true };

#[test]
fn the_signature_is_stripes_scheme_over_the_timestamp_and_the_body() {
    // Computed independently: printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_test
    let header = signature_header("whsec_test", 1_700_000_000, br#"{"a":1}"#);
    assert_eq!(
        header,
        "t=1700000000,v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"
    );
}

#[test]
fn private_link_local_and_loopback_addresses_are_refused_in_live_settings() {
    for ip in [
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(172, 16, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1)),
        IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(0, 0, 0, 0)),
        IpAddr::V4(Ipv4Addr::new(100, 64, 0, 1)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped()),
        IpAddr::V6(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped()),
    ] {
        assert!(!LIVE.permits(ip), "{ip}");
    }
    assert!(LIVE.permits(IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34))));
}

#[test]
fn the_loopback_setting_allows_loopback_and_nothing_else() {
    assert!(LOCAL.permits(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1))));
    assert!(LOCAL.permits(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    assert!(!LOCAL.permits(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
    assert!(!LOCAL.permits(IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254))));
    assert!(LOCAL.check_url("http://localhost:4242/hook").is_ok());
    assert!(LIVE.check_url("http://localhost:4242/hook").is_err());
    assert!(LIVE.check_url("http://127.0.0.1:4242/hook").is_err());
}

#[test]
fn only_http_and_https_urls_without_credentials_are_accepted() {
    assert!(LIVE.check_url("https://hooks.example.com/payments").is_ok());
    for url in [
        "ftp://hooks.example.com/",
        "file:///etc/passwd",
        "hooks.example.com/payments",
        "https://user:pass@hooks.example.com/",
        "http://[::1]/",
        "http://10.0.0.5/",
    ] {
        assert!(LIVE.check_url(url).is_err(), "{url}");
    }
}
