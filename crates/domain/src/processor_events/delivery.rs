//! A delivery verified and read: the signature over the exact bytes before anything is parsed,
//! then the event's shape ([`verify`]); the checks its header allows before the body is read
//! ([`check_header`]); why a delivery is refused ([`Refused`]).

use std::time::Duration;

use provider::signature::{self, SignatureError};
use provider::{Charge, PaymentIntent};
use serde::Deserialize;
use serde_json::Value;

use super::{ProcessorEvent, ProcessorEventType, Reported};

/// Why a delivery is refused: a `400`, and nothing is recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No `Stripe-Signature` header.
    #[error("the `Stripe-Signature` header is missing")]
    NoSignature,
    /// The signature does not hold, or its timestamp is outside the tolerance.
    #[error("{0}")]
    Signature(#[from] SignatureError),
    /// Signed, but not a Stripe event about a charge or a PaymentIntent.
    #[error("the payload is not an event about a charge or a PaymentIntent: {0}")]
    Malformed(String),
    /// Signed, and of a type this endpoint does not take: the route answers it `200` and records
    /// nothing, so that a processor subscribed to more types does not retry it for days.
    #[error("events of type `{kind}` are not taken here (only {known})", known = known_types())]
    UnknownType {
        /// The event's id.
        event: String,
        /// Its type.
        kind: String,
    },
}

/// The longest event id accepted.
const ID_MAX_CHARS: usize = 255;

#[derive(Deserialize)]
struct WireEvent {
    id: String,
    object: String,
    #[serde(rename = "type")]
    event_type: String,
    created: i64,
    data: WireData,
    #[serde(default)]
    request: Option<WireRequest>,
}

#[derive(Deserialize)]
struct WireData {
    object: Value,
}

#[derive(Deserialize)]
struct WireRequest {
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// Verifies a delivery as of `now` (unix seconds) and parses it: the signature over the exact
/// bytes first (nothing is parsed before it holds), then the timestamp, then the event's shape.
pub fn verify(
    payload: &[u8],
    header: Option<&str>,
    secret: &str,
    tolerance: Duration,
    now: i64,
) -> Result<ProcessorEvent, Refused> {
    let header = header.ok_or(Refused::NoSignature)?;
    signature::verify(payload, header, secret, tolerance, now)?;
    let wire: WireEvent =
        serde_json::from_slice(payload).map_err(|err| Refused::Malformed(err.to_string()))?;
    if wire.object != "event" {
        return Err(Refused::Malformed(format!("`object` is `{}`, not `event`", wire.object)));
    }
    if !wire.id.starts_with("evt_") || wire.id.chars().count() > ID_MAX_CHARS {
        return Err(Refused::Malformed("`id` is not an event id (`evt_…`)".into()));
    }
    let event_type = ProcessorEventType::parse(&wire.event_type).ok_or_else(|| {
        Refused::UnknownType { event: wire.id.clone(), kind: wire.event_type.clone() }
    })?;
    let object = wire.data.object.clone();
    // Stripe names every object's kind; a compatible server may not, and then the shape decides.
    let expected = if event_type.is_about_an_intent() { "payment_intent" } else { "charge" };
    if let Some(kind) = object.get("object").and_then(Value::as_str)
        && kind != expected
    {
        return Err(Refused::Malformed(format!("`data.object` is a {kind}, not a {expected}")));
    }
    let reported = if event_type.is_about_an_intent() {
        let intent: PaymentIntent = serde_json::from_value(object).map_err(|err| {
            Refused::Malformed(format!("`data.object` is not a PaymentIntent: {err}"))
        })?;
        Reported::Intent(intent)
    } else {
        let charge: Charge = serde_json::from_value(object)
            .map_err(|err| Refused::Malformed(format!("`data.object` is not a charge: {err}")))?;
        Reported::Charge(charge)
    };
    Ok(ProcessorEvent {
        id: wire.id,
        event_type,
        created: wire.created,
        reported,
        object: wire.data.object,
        downstream_key: wire.request.and_then(|request| request.idempotency_key),
    })
}

/// The checks a delivery's `Stripe-Signature` header allows before its body is read: present,
/// well-formed, and signed within `tolerance` of `now` ([`provider::signature::check_header`]).
/// A delivery that [`verify`] would refuse whatever its body is refused unread; [`verify`]
/// checks the header again, with the signature over the body.
pub fn check_header(header: Option<&str>, tolerance: Duration, now: i64) -> Result<(), Refused> {
    let header = header.ok_or(Refused::NoSignature)?;
    Ok(signature::check_header(header, tolerance, now)?)
}

/// The names of the events taken, for people.
fn known_types() -> String {
    ProcessorEventType::ALL.map(|t| t.to_string()).join(", ")
}
