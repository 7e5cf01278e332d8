//! Webhook endpoints: where an account's events are delivered, the rule on which URLs may be
//! registered (no server-side request forgery), the signature each delivery carries, and the
//! delivery log (`log`).
//!
//! The signature is Stripe's scheme: `Payments-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<body>")>`. The receiver recomputes it with the secret it was shown once, compares in
//! constant time, and refuses a timestamp outside its tolerance (a replay).

use std::net::IpAddr;

use idem::StoredResponse;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::events::{Event, EventRow, EventType};
use crate::ids::{self, AccountId, EventId, WebhookEndpointId};
use crate::problems::{Problem, ProblemCode};
use crate::stored::text_enum;

mod enabled;
mod log;

pub use enabled::EnabledEvents;

pub use log::{Attempt, DeliveryLine, Outcome, attempts, log_attempt, recent_deliveries};

/// The header a delivery's signature travels in.
pub const SIGNATURE_HEADER: &str = "Payments-Signature";

/// The most endpoints one account may have (deleted ones not counted): each event fans out to
/// every one of them, so this bounds the work one change makes.
pub const MAX_ENDPOINTS_PER_ACCOUNT: i64 = 16;

/// The longest URL accepted.
pub const URL_MAX_CHARS: usize = 2048;

/// `t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`: Stripe's scheme, which the processor's
/// own webhooks use too ([`provider::signature`]).
pub fn signature_header(secret: &str, unix_seconds: i64, body: &[u8]) -> String {
    provider::signature::sign(secret, unix_seconds, body)
}

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

text_enum! {
    /// Whether an endpoint receives deliveries.
    pub enum EndpointStatus {
        /// Events are delivered.
        Enabled,
        /// Nothing is delivered; deliveries already due are dropped.
        Disabled,
    }
}

/// One webhook endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `we_…`
    pub id: WebhookEndpointId,
    /// The owner.
    pub account_id: AccountId,
    /// Where deliveries are posted.
    pub url: String,
    /// The types delivered.
    pub enabled_events: EnabledEvents,
    /// `whsec_…`: shown once, at creation.
    pub secret: String,
    /// Enabled or disabled.
    pub status: EndpointStatus,
    /// Unix seconds.
    pub created: i64,
}

impl Endpoint {
    /// The public representation; the secret only when `with_secret` (the creation's answer).
    pub fn to_value(&self, with_secret: bool) -> Value {
        let mut value = json!({
            "id": self.id,
            "object": "webhook_endpoint",
            "url": self.url,
            "enabled_events": self.enabled_events,
            "status": self.status,
            "created": self.created,
        });
        if with_secret {
            value["secret"] = Value::String(self.secret.clone());
        }
        value
    }
}

/// Registers an endpoint with a fresh secret. The URL must have passed [`AddressRule::check_url`].
pub async fn create(
    conn: &mut PgConnection,
    account_id: &AccountId,
    url: &url::Url,
    enabled_events: &EnabledEvents,
) -> Result<Endpoint, DomainError> {
    let id = WebhookEndpointId::generate();
    let secret = ids::with_random_suffix("whsec", 32);
    // The count and the insert in one statement, under the account's row lock, so that two
    // concurrent creations cannot both pass the bound.
    let endpoint = sqlx::query_as!(
        Endpoint,
        r#"
        WITH owner AS (SELECT id FROM accounts WHERE id = $2 FOR UPDATE)
        INSERT INTO webhook_endpoints (id, account_id, url, enabled_events, secret)
        SELECT $1, owner.id, $3, $4, $5 FROM owner
         WHERE (SELECT count(*) FROM webhook_endpoints
                 WHERE account_id = $2 AND deleted_at IS NULL) < $6
        RETURNING id AS "id: _", account_id AS "account_id: _", url,
                  enabled_events AS "enabled_events: _", secret, status AS "status: _",
                  extract(epoch FROM created_at)::bigint AS "created!"
        "#,
        &id as &WebhookEndpointId,
        account_id as &AccountId,
        url.as_str(),
        enabled_events as &EnabledEvents,
        secret,
        MAX_ENDPOINTS_PER_ACCOUNT,
    )
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| DomainError::Invalid {
        param: "url",
        message: format!(
            "An account has at most {MAX_ENDPOINTS_PER_ACCOUNT} webhook endpoints; delete one first."
        ),
    })?;
    Ok(endpoint)
}

/// The account's endpoint of this id, unless deleted.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &WebhookEndpointId,
) -> Result<Option<Endpoint>, DomainError> {
    let endpoint = sqlx::query_as!(
        Endpoint,
        r#"SELECT id AS "id: _", account_id AS "account_id: _", url,
                  enabled_events AS "enabled_events: _", secret, status AS "status: _",
                  extract(epoch FROM created_at)::bigint AS "created!"
             FROM webhook_endpoints
            WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL"#,
        id as &WebhookEndpointId,
        account_id as &AccountId,
    )
    .fetch_optional(executor)
    .await?;
    Ok(endpoint)
}

/// Whether the account ever registered endpoint `id`, deleted since or not (a deleted endpoint's
/// row stays, for its delivery log).
pub async fn registered(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &WebhookEndpointId,
) -> Result<bool, DomainError> {
    let registered = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT FROM webhook_endpoints WHERE id = $1 AND account_id = $2)
               AS "registered!""#,
        id as &WebhookEndpointId,
        account_id as &AccountId,
    )
    .fetch_one(executor)
    .await?;
    Ok(registered)
}

/// The account's endpoints, newest first (at most [`MAX_ENDPOINTS_PER_ACCOUNT`]).
pub async fn list(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
) -> Result<Vec<Endpoint>, DomainError> {
    let endpoints = sqlx::query_as!(
        Endpoint,
        r#"SELECT id AS "id: _", account_id AS "account_id: _", url,
                  enabled_events AS "enabled_events: _", secret, status AS "status: _",
                  extract(epoch FROM created_at)::bigint AS "created!"
             FROM webhook_endpoints
            WHERE account_id = $1 AND deleted_at IS NULL
            ORDER BY seq DESC"#,
        account_id as &AccountId,
    )
    .fetch_all(executor)
    .await?;
    Ok(endpoints)
}

/// Sets an endpoint's status; `None` when the account has no such endpoint.
pub async fn set_status(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &WebhookEndpointId,
    status: EndpointStatus,
) -> Result<Option<Endpoint>, DomainError> {
    let endpoint = sqlx::query_as!(
        Endpoint,
        r#"UPDATE webhook_endpoints SET status = $3
            WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL
        RETURNING id AS "id: _", account_id AS "account_id: _", url,
                  enabled_events AS "enabled_events: _", secret, status AS "status: _",
                  extract(epoch FROM created_at)::bigint AS "created!""#,
        id as &WebhookEndpointId,
        account_id as &AccountId,
        status as EndpointStatus,
    )
    .fetch_optional(executor)
    .await?;
    Ok(endpoint)
}

/// Deletes an endpoint (kept for its delivery log, never delivered to again); false when the
/// account has no such endpoint.
pub async fn delete(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &WebhookEndpointId,
) -> Result<bool, DomainError> {
    let deleted = sqlx::query!(
        "UPDATE webhook_endpoints SET deleted_at = now()
          WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
        id as &WebhookEndpointId,
        account_id as &AccountId,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(deleted == 1)
}

/// What a delivery job needs: the event, and the endpoint as it is now (`None` when it was
/// deleted or disabled since the event: nothing is delivered then).
pub async fn delivery(
    executor: impl PgExecutor<'_>,
    event_id: &EventId,
    endpoint_id: &WebhookEndpointId,
) -> Result<Option<(Event, Option<Endpoint>, i64)>, DomainError> {
    let row = sqlx::query!(
        r#"SELECT e.id AS "id: EventId", e.account_id AS "account_id: AccountId",
                  e.type AS "event_type: EventType", e.object,
                  extract(epoch FROM e.created_at)::bigint AS "created!",
                  (extract(epoch FROM now() - e.created_at) * 1000)::bigint AS "age_ms!",
                  w.id AS "endpoint_id?: WebhookEndpointId", w.url AS "url?",
                  w.enabled_events AS "enabled_events?: EnabledEvents",
                  w.secret AS "secret?", w.status AS "status?: EndpointStatus",
                  extract(epoch FROM w.created_at)::bigint AS "endpoint_created?"
             FROM events e
             LEFT JOIN webhook_endpoints w
               ON w.id = $2 AND w.account_id = e.account_id AND w.deleted_at IS NULL
              AND w.status = 'enabled'
            WHERE e.id = $1"#,
        event_id as &EventId,
        endpoint_id as &WebhookEndpointId,
    )
    .fetch_optional(executor)
    .await?;
    let Some(r) = row else { return Ok(None) };
    let endpoint = match (r.endpoint_id, r.url, r.enabled_events, r.secret, r.status) {
        (Some(id), Some(url), Some(enabled_events), Some(secret), Some(status)) => Some(Endpoint {
            id,
            account_id: r.account_id.clone(),
            url,
            enabled_events,
            secret,
            status,
            created: r.endpoint_created.unwrap_or_default(),
        }),
        _ => None,
    };
    let event = Event::from(EventRow {
        id: r.id,
        account_id: r.account_id,
        event_type: r.event_type,
        object: r.object,
        created: r.created,
    });
    Ok(Some((event, endpoint, r.age_ms)))
}

/// The answer to a creation: `201`, the endpoint with its secret, and its `Location`.
pub fn created_answer(endpoint: &Endpoint) -> StoredResponse {
    let body = endpoint.to_value(true).to_string().into_bytes();
    StoredResponse::json(201, body)
        .with_header("location", format!("/v1/webhook_endpoints/{}", endpoint.id))
}

/// The answer to an update: `200` and the endpoint, without its secret.
pub fn updated_answer(endpoint: &Endpoint) -> StoredResponse {
    let body = endpoint.to_value(false).to_string().into_bytes();
    StoredResponse::json(200, body)
}

/// The problem an unknown (or deleted) endpoint answers.
pub fn missing_endpoint(id: &str) -> Problem {
    Problem::new(ProblemCode::ResourceMissing, format!("No such webhook endpoint: '{id}'."))
        .with_param("id")
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

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
}
