//! Webhook endpoints: where an account's events are delivered, the rule on which URLs may be
//! registered (no server-side request forgery), the signature each delivery carries, and the
//! delivery log (`log`).
//!
//! The signature is Stripe's scheme: `Payments-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<body>")>`. The receiver recomputes it with the secret it was shown once, compares in
//! constant time, and refuses a timestamp outside its tolerance (a replay).
//!
//! Here: an endpoint ([`Endpoint`]) and the answers that show it. The URL rule is in `address`
//! (the special-purpose address registries it reads in `special`),
//! the endpoints' SQL in `store`, the types an endpoint takes in `enabled`, the delivery log in
//! `log`, the signing secret sealed at rest in `sealed`.
//!
//! The answer to a creation is stored (for a retry with its key) with the secret sealed, as the
//! row holds it: what the database and the replay cache keep for the retention window cannot be
//! read without the sealing key. [`reveal_secret`] opens it on the way out, to the first answer
//! and to every replay alike, so both are the same bytes.

use idem::StoredResponse;
use serde_json::{Value, json};

use crate::ids::{AccountId, WebhookEndpointId};
use crate::problems::{Problem, ProblemCode};
use crate::stored::text_enum;

mod address;
mod enabled;
mod log;
mod sealed;
mod special;
mod store;

pub use address::AddressRule;
pub use enabled::EnabledEvents;
pub use log::{
    Attempt, DeliveryLine, Failure, Outcome, attempts, delete_expired_attempts, log_attempt,
    recent_deliveries,
};
pub use sealed::{KeyId, SealedSecret, SealingKeys, SigningSecret, Unsealable};
pub use store::{create, delete, delivery, find, list, registered, reseal, set_status};

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
    /// `whsec_…`, sealed: shown once, at creation; opened to sign a delivery.
    pub secret: SealedSecret,
    /// Enabled or disabled.
    pub status: EndpointStatus,
    /// Unix seconds.
    pub created: i64,
}

impl Endpoint {
    /// The public representation; with `with_secret` (the creation's stored answer), the secret
    /// sealed ([`reveal_secret`] opens it in the answer sent).
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
            value["secret"] = Value::String(self.secret.to_text());
        }
        value
    }
}

/// The answer to a creation as it is stored: `201`, the endpoint with its secret sealed, and its
/// `Location`.
pub fn created_answer(endpoint: &Endpoint) -> StoredResponse {
    let body = endpoint.to_value(true).to_string().into_bytes();
    StoredResponse::json(201, body)
        .with_header("location", format!("/v1/webhook_endpoints/{}", endpoint.id))
}

/// The answer to a creation as it is sent, first or replayed: [`created_answer`]'s, its secret
/// opened. Any other answer (a problem) is as stored. The body is the JSON text it was with the
/// secret's plain text in place of its sealed form, so the first answer and every replay are the
/// same bytes.
pub fn reveal_secret(
    answer: StoredResponse,
    keys: &SealingKeys,
) -> Result<StoredResponse, Unsealable> {
    if answer.status != 201 {
        return Ok(answer);
    }
    let mut body: Value =
        serde_json::from_slice(&answer.body).map_err(|_| Unsealable::Malformed)?;
    let sealed = body["secret"].as_str().ok_or(Unsealable::Malformed)?;
    let sealed = SealedSecret::from_text(sealed)?;
    let id = body["id"].as_str().and_then(|id| WebhookEndpointId::parse(id).ok());
    let id = id.ok_or(Unsealable::Malformed)?;
    body["secret"] = Value::String(keys.open(&sealed, &id)?.expose().to_owned());
    Ok(StoredResponse { body: body.to_string().into_bytes(), ..answer })
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
mod tests;
