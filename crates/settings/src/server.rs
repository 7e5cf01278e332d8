//! `[http]` and `[rate_limit]`: the listener, the limits that bound what one connection or
//! request may hold, and the rates an account and a client address may make requests at.

use serde::Deserialize;

use crate::AddressRanges;

/// `[http]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    /// Address of the admin listener (`/metrics`, the detailed readiness): loopback unless the
    /// operator's scraper must reach it from elsewhere.
    pub admin_host: String,
    /// Port of the admin listener; 0 picks a free one.
    pub admin_port: u16,
    /// The base of links the API hands out; empty means `http://{host}:{port}`.
    pub public_base_url: String,
    /// Largest accepted request body.
    pub body_limit_bytes: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace_ms: u64,
    /// Limit for a request's line and headers, counted from when the connection waits for a
    /// request (so it also bounds an idle keep-alive connection).
    pub header_read_timeout_ms: u64,
    /// Largest request line and headers, in bytes; larger is `431` and the connection closes.
    /// Bounds what a connection that is still sending its headers holds in memory.
    pub max_header_bytes: u64,
    /// Longest a kept-alive connection may sit idle after an answer before the next request's
    /// first byte; shorter than `header_read_timeout_ms`.
    pub idle_timeout_ms: u64,
    /// Longest a write to the client may make no progress (the client stopped reading its
    /// answers); past it the connection is closed.
    pub write_timeout_ms: u64,
    /// Longest pause between two pieces of a request body.
    pub body_timeout_ms: u64,
    /// Longest a whole request body may take to arrive (`request_timeout_ms` bounds it too); it is
    /// read holding no place in flight.
    pub body_deadline_ms: u64,
    /// Limit for a whole request, headers to answer.
    pub request_timeout_ms: u64,
    /// Open connections at most.
    pub max_connections: u32,
    /// Open connections from one source at most (an IPv4 address, an IPv6 /64; a trusted proxy
    /// is not held to it); more are closed at once.
    pub max_connections_per_source: u32,
    /// Requests served at once at most; more are answered 503.
    pub max_in_flight_requests: u32,
    /// The proxies whose forwarding header names the client; empty: none, the header is ignored.
    pub trusted_proxies: AddressRanges,
    /// The header those proxies name the client in.
    pub forwarded_header: ForwardedHeader,
}

/// `[rate_limit]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// Sustained requests per second per account; 0 turns the limit off.
    pub per_second: u32,
    /// Requests an account may make at once.
    pub burst: u32,
    /// Lookups of API keys per second per client address (keys neither known to be live nor
    /// found unknown lately); 0: no limit.
    pub per_address_per_second: u32,
    /// Such requests one address may make at once.
    pub per_address_burst: u32,
    /// How long an unknown API key is answered 401 without a lookup.
    pub unknown_key_cache_ms: u64,
    /// Lookups of API keys per second in all, from every address (keys neither known to be live
    /// nor found unknown lately); more are answered 503. 0: no limit.
    pub lookups_per_second: u32,
    /// Requests of one account in flight at once at most (a share of
    /// `http.max_in_flight_requests`); more are answered 429. 0: no limit.
    pub account_in_flight: u32,
    /// Requests per second per client address that present no API key (health, the OpenAPI
    /// document, the problem pages, the inspector's login); more are answered 429. 0: no limit.
    pub anonymous_per_second: u32,
    /// Such requests one address may make at once.
    pub anonymous_burst: u32,
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
