//! Tests of the endpoints' rules: the signature's scheme, and the addresses and URLs refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;

const LIVE: AddressRule = AddressRule { allow_loopback: false, deny_ranges: Vec::new() };
const LOCAL: AddressRule = AddressRule { allow_loopback: true, deny_ranges: Vec::new() };

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

#[test]
fn a_url_with_a_control_or_format_character_is_refused_naming_url() {
    for url in [
        "https://hooks.example.com/pay\tments",
        "https://hooks.example.com/\npayments",
        "https://hooks.exa\u{200b}mple.com/payments",
        "https://hooks.example.com/\u{202e}stnemyap",
        "\u{feff}https://hooks.example.com/payments",
    ] {
        match LIVE.check_url(url) {
            Err(crate::DomainError::Invalid { param, message }) => {
                assert_eq!(param, "url", "{url:?}");
                assert!(message.contains("U+"), "{url:?}: {message}");
            }
            other => panic!("{url:?}: {other:?}"),
        }
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap_or_else(|err| panic!("{text}: {err}"))
}

/// The IPv6 forms that carry `v4`, each judged by it: IPv4-mapped, NAT64's well-known prefix,
/// 6to4.
fn carriers(v4: Ipv4Addr) -> [(&'static str, IpAddr); 3] {
    let [a, b, c, d] = v4.octets();
    let high = u16::from_be_bytes([a, b]);
    let low = u16::from_be_bytes([c, d]);
    [
        ("IPv4-mapped", IpAddr::V6(v4.to_ipv6_mapped())),
        ("NAT64", IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, high, low))),
        ("6to4", IpAddr::V6(Ipv6Addr::new(0x2002, high, low, 0, 0, 0, 0, 1))),
    ]
}

#[test]
fn every_ipv4_range_the_registry_marks_not_global_is_refused() {
    for text in [
        "0.0.0.0",
        "0.1.2.3",
        "10.0.0.1",
        "100.64.0.1",
        "100.127.255.254",
        "127.0.0.1",
        "169.254.169.254",
        "172.16.0.1",
        "172.31.255.255",
        "192.0.0.1",
        "192.0.0.9", // PCP anycast, marked global: refused with its block
        "192.0.0.170",
        "192.0.2.1",
        "192.88.99.1",
        "192.168.1.1",
        "198.18.0.1",
        "198.19.255.255",
        "198.51.100.7",
        "203.0.113.9",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
    ] {
        assert!(!LIVE.permits(ip(text)), "{text}");
    }
}

#[test]
fn every_ipv6_range_the_registry_marks_not_global_is_refused() {
    for text in [
        "::",
        "::1",
        "::ffff:0:10.0.0.1",  // IPv4-translated (RFC 2765): outside 2000::/3
        "64:ff9b:1::8.8.8.8", // local-use NAT64: whatever it embeds
        "100::1",
        "100:0:0:1::1",
        "2001::1",
        "2001:1::1", // PCP anycast, marked global: refused with 2001::/23
        "2001:2::1",
        "2001:20::1",
        "2001:db8::1",
        "3fff::1",
        "3fff:fff:ffff::1",
        "5f00::1",
        "fc00::1",
        "fd00:ec2::254", // AWS's metadata service over IPv6
        "fe80::1",
        "fec0::1",
        "ff02::1",
        "4000::1", // not global unicast
    ] {
        assert!(!LIVE.permits(ip(text)), "{text}");
    }
}

#[test]
fn nat64_addresses_are_judged_by_the_ipv4_address_they_embed() {
    for text in ["64:ff9b::10.0.0.1", "64:ff9b::127.0.0.1", "64:ff9b::169.254.169.254"] {
        assert!(!LIVE.permits(ip(text)), "{text}");
        // The translator's loopback is not this machine's: refused even where loopback is not.
        assert!(!LOCAL.permits(ip(text)), "{text}");
    }
    assert!(LIVE.permits(ip("64:ff9b::8.8.8.8")));
    assert!(LIVE.permits(ip("64:ff9b::93.184.216.34")));
}

#[test]
fn sixtofour_addresses_are_judged_by_the_ipv4_address_they_embed() {
    // 2002:AABB:CCDD::/48 carries AA.BB.CC.DD.
    for text in ["2002:0a00:0001::1", "2002:7f00:0001::", "2002:a9fe:a9fe::1", "2002:c0a8:0101::"] {
        assert!(!LIVE.permits(ip(text)), "{text}");
        assert!(!LOCAL.permits(ip(text)), "{text}");
    }
    assert!(LIVE.permits(ip("2002:5db8:d822::1")), "93.184.216.34");
}

#[test]
fn teredo_and_ipv4_compatible_addresses_are_refused_whatever_they_embed() {
    // Teredo: server 65.54.227.120, client 8.8.8.8 (its bits inverted in the last 32).
    assert!(!LIVE.permits(ip("2001:0:4136:e378:8000:63bf:f7f7:f7f7")));
    assert!(!LIVE.permits(ip("2001:0:4136:e378:8000:63bf:3fff:fdd2")));
    for text in ["::10.0.0.1", "::127.0.0.1", "::8.8.8.8", "::93.184.216.34"] {
        assert!(!LIVE.permits(ip(text)), "{text}");
        assert!(!LOCAL.permits(ip(text)), "{text}");
    }
}

#[test]
fn a_providers_host_service_is_refused_though_it_looks_public() {
    assert!(!LIVE.permits(ip("168.63.129.16")));
    for (form, carried) in carriers(Ipv4Addr::new(168, 63, 129, 16)) {
        assert!(!LIVE.permits(carried), "{form}");
    }
    assert!(LIVE.permits(ip("168.63.129.17")));
}

#[test]
fn configured_deny_ranges_are_refused_in_every_form() {
    let rule = AddressRule {
        allow_loopback: false,
        deny_ranges: vec!["93.184.216.0/24".parse().unwrap(), "2606:4700::/32".parse().unwrap()],
    };
    assert!(!rule.permits(ip("93.184.216.34")));
    for (form, carried) in carriers(Ipv4Addr::new(93, 184, 216, 34)) {
        assert!(!rule.permits(carried), "{form}");
        assert!(LIVE.permits(carried), "{form}");
    }
    assert!(!rule.permits(ip("2606:4700::1111")));
    assert!(rule.permits(ip("93.184.217.1")));
    assert!(rule.permits(ip("2606:4701::1")));
    assert!(rule.check_url("https://93.184.216.34/hooks").is_err());
    assert!(LIVE.check_url("https://93.184.216.34/hooks").is_ok());
}

#[test]
fn ordinary_public_addresses_are_permitted() {
    for text in [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "100.63.255.255",
        "100.128.0.0",
        "172.32.0.1",
        "192.0.1.1",
        "192.31.196.1", // AS112, marked global
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "2606:4700::1111",
        "2a00:1450:4001:82b::200e",
        "2001:4860:4860::8888",
        "2620:4f:8000::1", // AS112 over IPv6, marked global
        "::ffff:93.184.216.34",
    ] {
        assert!(LIVE.permits(ip(text)), "{text}");
    }
}

proptest::proptest! {
    /// However an IPv4 address is carried, it gets the answer it gets itself, under the registries
    /// and under a deny range.
    #[test]
    fn an_ipv4_address_is_judged_alike_in_every_form_that_carries_it(bits: u32, prefix in 0u8..=32) {
        let v4 = Ipv4Addr::from(bits);
        let denying = AddressRule {
            allow_loopback: false,
            deny_ranges: vec![ipnet::IpNet::new(IpAddr::V4(v4), prefix).unwrap().trunc()],
        };
        for (form, carried) in carriers(v4) {
            proptest::prop_assert_eq!(
                LIVE.permits(IpAddr::V4(v4)), LIVE.permits(carried), "{} {}", form, carried
            );
            proptest::prop_assert!(!denying.permits(carried), "{} {}", form, carried);
        }
    }
}

fn sealed_endpoint(keys: &SealingKeys, secret: &SigningSecret) -> Endpoint {
    let id = WebhookEndpointId::parse("we_test1").unwrap();
    Endpoint {
        secret: keys.seal(secret, &id),
        id,
        account_id: "acct_1".parse().unwrap(),
        url: "https://example.com/hook".into(),
        enabled_events: EnabledEvents::All,
        status: EndpointStatus::Enabled,
        created: 1_700_000_000,
    }
}

#[test]
fn an_endpoint_prints_no_secret() {
    let keys = SealingKeys::new([3; 32], []);
    let secret = SigningSecret::generate();
    let printed = format!("{:?}", sealed_endpoint(&keys, &secret));
    assert!(printed.contains("we_test1"), "{printed}");
    assert!(!printed.contains(&secret.expose()["whsec_".len()..]), "{printed}");
}

#[test]
fn the_stored_creation_holds_the_secret_sealed_and_the_answer_sent_holds_it_in_plain() {
    let keys = SealingKeys::new([3; 32], []);
    let secret = SigningSecret::generate();
    let endpoint = sealed_endpoint(&keys, &secret);
    let stored = created_answer(&endpoint);
    let random = &secret.expose()["whsec_".len()..];
    assert!(!String::from_utf8_lossy(&stored.body).contains(random));
    let sent = reveal_secret(stored.clone(), &keys).unwrap();
    // What the answer was before secrets were sealed, byte for byte.
    let mut plain = endpoint.to_value(false);
    plain["secret"] = Value::String(secret.expose().to_owned());
    assert_eq!(String::from_utf8(sent.body.clone()).unwrap(), plain.to_string());
    assert_eq!((sent.status, &sent.headers), (stored.status, &stored.headers));
    // Every replay opens the same stored bytes to the same answer.
    assert_eq!(reveal_secret(stored.clone(), &keys).unwrap(), sent);
    // Without the key that sealed it, nothing is revealed.
    let other = SealingKeys::new([4; 32], []);
    assert!(matches!(reveal_secret(stored, &other), Err(Unsealable::UnknownKey(_))));
    // A refusal stored for the key is sent as stored.
    let refused = StoredResponse::json(400, br#"{"code":"invalid_request"}"#.to_vec());
    assert_eq!(reveal_secret(refused.clone(), &keys).unwrap(), refused);
}
