//! Webhooks from the card processor (`POST /webhooks/processor`): the push path of
//! reconciliation, beside search.
//!
//! A delivery is verified before anything is read ([`verify`]: Stripe's `Stripe-Signature` over
//! the exact bytes, constant-time, with a timestamp tolerance), then parsed as a Stripe event
//! about a charge. [`receive`] is the idempotent consumer: in one transaction, holding the
//! payment's row, it records the event id (a redelivery finds it and changes nothing) with its
//! effect: the key that creates the charge's payment is made due for the completer at once, or,
//! for a successful charge the payment does not account for (it records another, or it was
//! recorded `failed` without one), an audit record for a person ([`ExtraCharge`]).
//!
//! The event never changes a payment itself. The create-payment operation, holding the key's
//! lease, asks [`charge_for_key`] whether the processor told us what its planned call (its
//! downstream key) made, and adopts that charge in its own fenced phase instead of calling again
//! or searching. So a payment has one writer whatever the timing: a request mid-call when the
//! event lands, the completer, or nobody (the key then waits for its next attempt, brought
//! forward).

use std::time::Duration;

use provider::Charge;
use provider::signature::{self, SignatureError};
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgExecutor, PgPool};

use crate::DomainError;
use crate::audit::{self, AuditEvent};
use crate::ids::{AccountId, PaymentId};
use crate::payments::{self, ChargeRecord, PaymentStatus};
use crate::stored::{from_name, text_enum};

/// The header the processor's signature travels in.
pub use provider::signature::STRIPE_SIGNATURE_HEADER as SIGNATURE_HEADER;

text_enum! {
    /// What the processor tells us about a charge, by the processor's names (stored as they are).
    pub enum ChargeEventType {
        /// A charge was made and authorized (captured at once or not).
        Succeeded = "charge.succeeded",
        /// A charge was made and declined.
        Failed = "charge.failed",
        /// An authorized charge was captured.
        Captured = "charge.captured",
        /// A charge was refunded, or its authorization released.
        Refunded = "charge.refunded",
    }
}

impl ChargeEventType {
    /// The type of this name; `None` for one we do not take.
    pub fn parse(name: &str) -> Option<Self> {
        from_name(name)
    }

    /// Whether the event reports the charge's creation, which the create-payment operation's
    /// downstream key made.
    fn creates(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// A verified event about a charge.
#[derive(Debug, Clone)]
pub struct ProcessorEvent {
    /// The processor's `evt_…`: the dedupe key.
    pub id: String,
    /// What happened.
    pub event_type: ChargeEventType,
    /// Unix seconds, by the processor's clock.
    pub created: i64,
    /// The charge right after the change.
    pub charge: Charge,
    /// `data.object` as received, stored as evidence.
    pub object: Value,
    /// `request.idempotency_key`: the downstream key of the call that made the change.
    pub downstream_key: Option<String>,
}

/// Why a delivery is refused: a `400`, and nothing is recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No `Stripe-Signature` header.
    #[error("the `Stripe-Signature` header is missing")]
    NoSignature,
    /// The signature does not hold, or its timestamp is outside the tolerance.
    #[error("{0}")]
    Signature(#[from] SignatureError),
    /// Signed, but not a Stripe event about a charge.
    #[error("the payload is not an event about a charge: {0}")]
    Malformed(String),
    /// An event of a type this endpoint does not take.
    #[error(
        "events of type `{0}` are not taken here (only charge.succeeded, charge.failed, charge.captured, charge.refunded)"
    )]
    UnknownType(String),
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
    let event_type =
        ChargeEventType::parse(&wire.event_type).ok_or(Refused::UnknownType(wire.event_type))?;
    let charge: Charge = serde_json::from_value(wire.data.object.clone())
        .map_err(|err| Refused::Malformed(format!("`data.object` is not a charge: {err}")))?;
    Ok(ProcessorEvent {
        id: wire.id,
        event_type,
        created: wire.created,
        charge,
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

/// What receiving an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Recorded against one of our payments; `woke` if the key creating it was unfinished and is
    /// now due for the completer.
    Recorded {
        /// The payment.
        payment_id: PaymentId,
        /// Whether the creating key was brought forward.
        woke: bool,
    },
    /// Recorded against one of our payments, which has another charge recorded, or was recorded
    /// `failed` without one: the processor charged the card once more than the payment says (an
    /// earlier generation of the downstream key made a charge that the lookups missed, or the
    /// processor charged despite the refusal it answered). Audited as `payment.extra_charge` for
    /// a person; nothing is refunded automatically.
    ExtraCharge {
        /// The payment.
        payment_id: PaymentId,
        /// The charge the event reports, which the payment does not account for.
        extra: ExtraCharge,
    },
    /// Recorded, about a charge that is none of our payments': nothing else to do.
    Unmatched,
    /// This event id was received before: nothing changed.
    Duplicate,
}

/// The idempotent consumer: records the event and its effect in one transaction, or finds it
/// recorded and changes nothing.
pub async fn receive(pool: &PgPool, event: &ProcessorEvent) -> Result<Received, DomainError> {
    let mut tx = pool.begin().await?;
    // An id that is not one of ours in shape names none of our payments.
    let payment_id =
        event.charge.metadata.get("payment_id").and_then(|id| PaymentId::parse(id).ok());
    let payment = match &payment_id {
        Some(id) => payments::lock_for_news(&mut tx, id).await?,
        None => None,
    };
    let known = payment.is_some().then_some(payment_id).flatten();
    // Two deliveries of one event at once: the second waits on the first's row, then inserts
    // nothing.
    let inserted = sqlx::query!(
        r#"INSERT INTO processor_events
               (id, type, charge_id, payment_id, downstream_key, charge, created)
           VALUES ($1, $2, $3, $4, $5, $6, $7)
           ON CONFLICT (id) DO NOTHING"#,
        event.id,
        event.event_type as ChargeEventType,
        event.charge.id,
        known.as_ref() as Option<&PaymentId>,
        event.downstream_key,
        event.object,
        event.created,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(Received::Duplicate);
    }
    let received = match (known, payment) {
        (Some(payment_id), Some(payment)) => match unaccounted(&payment, event) {
            Some(extra) => {
                let (account, key_id) = (&payment.account_id, payment.key_id);
                let found_by = ("webhook", &*event.id);
                audit_extra_charge(&mut tx, &payment_id, account, key_id, &extra, found_by).await?;
                Received::ExtraCharge { payment_id, extra }
            }
            // Nothing the payment does not account for: wake its creating key, which does nothing
            // once the key is finished (a payment that records a charge or its outcome).
            None => {
                let woke = match payment.key_id {
                    Some(key_id) => {
                        event.event_type.creates() && idem::wake(&mut *tx, key_id).await?
                    }
                    None => false,
                };
                Received::Recorded { payment_id, woke }
            }
        },
        _ => Received::Unmatched,
    };
    tx.commit().await?;
    if let Received::ExtraCharge { payment_id, extra } = &received {
        report_extra_charge(payment_id, extra, "webhook");
    }
    Ok(received)
}

/// The charge `event` reports as a success, if `payment` does not account for it: the payment
/// records another charge, or its outcome is recorded (it is no longer `processing`) without any
/// charge, so no phase will ever adopt this one (the key is finished: a refusal was recorded).
fn unaccounted(payment: &ChargeRecord, event: &ProcessorEvent) -> Option<ExtraCharge> {
    if event.event_type != ChargeEventType::Succeeded {
        return None;
    }
    let accounted = match &payment.charge_id {
        Some(recorded) => *recorded == event.charge.id,
        None => payment.status == PaymentStatus::Processing,
    };
    (!accounted).then(|| ExtraCharge {
        charge_id: event.charge.id.clone(),
        downstream_key: event.downstream_key.clone(),
        recorded: payment.charge_id.clone(),
    })
}

/// A successful charge at the processor for a payment that records another one (or none): an
/// earlier generation of the downstream key made it, and the lookups missed it (or the processor
/// made it despite refusing the call). The card was charged once more than the payment records;
/// a person refunds the extra charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraCharge {
    /// The charge the payment does not account for.
    pub charge_id: String,
    /// The downstream key of the call that made it, as the processor reported it.
    pub downstream_key: Option<String>,
    /// The charge the payment records, if any.
    pub recorded: Option<String>,
}

/// Records `extra` for a person, in the caller's transaction: an audit record
/// `payment.extra_charge` under the payment's creating key `key_id` (the inspector shows it on
/// that key's page), found by `found_by` (`webhook` or `phase`, and the event or request that
/// found it). Once that transaction commits, the caller reports it ([`report_extra_charge`]).
pub(crate) async fn audit_extra_charge(
    conn: &mut PgConnection,
    payment_id: &PaymentId,
    account_id: &AccountId,
    key_id: Option<i64>,
    extra: &ExtraCharge,
    (found_by, request_id): (&'static str, &str),
) -> Result<(), DomainError> {
    let Some(key_id) = key_id else { return Ok(()) };
    let detail = json!({
        "extra_charge": extra.charge_id,
        "downstream_key": extra.downstream_key,
        "recorded_charge": extra.recorded,
        "found_by": found_by,
    });
    let event = AuditEvent {
        account_id,
        object_id: payment_id,
        action: "payment.extra_charge",
        request_id,
        idempotency_key_id: key_id,
        detail,
    };
    audit::record(conn, &event).await
}

/// After the transaction that audited `extra` committed (a phase or a delivery that rolled back
/// reports nothing): an error in the log and the counter `payments_extra_charges_total`, which
/// alerting watches.
pub fn report_extra_charge(payment_id: &PaymentId, extra: &ExtraCharge, found_by: &str) {
    tracing::error!(
        %payment_id,
        recorded_charge = extra.recorded,
        extra_charge = extra.charge_id,
        downstream_key = extra.downstream_key,
        found_by,
        "the processor charged the card once more than the payment records: a person must refund the extra charge"
    );
    metrics::counter!("payments_extra_charges_total").increment(1);
}

/// A successful charge the processor reported for `payment_id` other than `recorded`, the one the
/// payment records (`None`: it records none, so any): for the phase that records the payment's
/// outcome, which holds the payment's row, as [`receive`] does for news that lands afterwards.
pub async fn other_succeeded_charge(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
    recorded: Option<&str>,
) -> Result<Option<ExtraCharge>, DomainError> {
    let row = sqlx::query!(
        r#"SELECT charge_id, downstream_key FROM processor_events
            WHERE payment_id = $1 AND type = 'charge.succeeded' AND charge_id IS DISTINCT FROM $2
            ORDER BY created, received_at LIMIT 1"#,
        payment_id as &PaymentId,
        recorded,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|r| ExtraCharge {
        charge_id: r.charge_id,
        downstream_key: r.downstream_key,
        recorded: recorded.map(str::to_owned),
    }))
}

/// The charge the processor says the call under `downstream_key` made, if an event told us.
/// Only creation events carry a charge's creating key; the latest wins.
pub async fn charge_for_key(
    executor: impl PgExecutor<'_>,
    downstream_key: &str,
) -> Result<Option<Charge>, DomainError> {
    let row = sqlx::query!(
        r#"SELECT charge FROM processor_events
            WHERE downstream_key = $1 AND type IN ('charge.succeeded', 'charge.failed')
            ORDER BY created DESC, received_at DESC LIMIT 1"#,
        downstream_key,
    )
    .fetch_optional(executor)
    .await?;
    row.map(|r| serde_json::from_value(r.charge))
        .transpose()
        .map_err(|_| DomainError::Corrupt("processor_events.charge"))
}

/// A successful charge the processor reported for `payment_id` under a downstream key other
/// than `downstream_key` (an earlier generation of it), as `(charge id, that key)`.
pub async fn paid_under_another_key(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
    downstream_key: &str,
) -> Result<Option<(String, String)>, DomainError> {
    let row = sqlx::query!(
        r#"SELECT charge_id, downstream_key AS "downstream_key!" FROM processor_events
            WHERE payment_id = $1 AND type = 'charge.succeeded'
              AND downstream_key IS NOT NULL AND downstream_key <> $2
            ORDER BY created, received_at LIMIT 1"#,
        payment_id as &PaymentId,
        downstream_key,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|r| (r.charge_id, r.downstream_key)))
}

/// How many events were received (for tests and the inspector).
pub async fn count(executor: impl PgExecutor<'_>) -> Result<i64, DomainError> {
    let row = sqlx::query!(r#"SELECT count(*) AS "count!" FROM processor_events"#)
        .fetch_one(executor)
        .await?;
    Ok(row.count)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    const SECRET: &str = "whsec_processor";
    const NOW: i64 = 1_700_000_000;

    fn event(kind: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "evt_1", "object": "event", "api_version": "2024-06-20", "created": NOW,
            "livemode": false, "pending_webhooks": 1, "type": kind,
            "request": {"id": null, "idempotency_key": "pay_1/charge"},
            "data": {"object": {
                "id": "ch_1", "object": "charge", "amount": 500, "currency": "usd",
                "captured": true, "paid": true, "status": "succeeded", "amount_captured": 500,
                "amount_refunded": 0, "refunded": false, "metadata": {"payment_id": "pay_1"},
            }},
        }))
        .unwrap()
    }

    fn check(payload: &[u8], header: &str) -> Result<ProcessorEvent, Refused> {
        verify(payload, Some(header), SECRET, signature::DEFAULT_TOLERANCE, NOW)
    }

    #[test]
    fn a_header_that_no_body_could_make_good_is_refused_before_the_body() {
        let tolerance = signature::DEFAULT_TOLERANCE;
        let good = signature::sign(SECRET, NOW, b"{}");
        assert_eq!(check_header(Some(&good), tolerance, NOW), Ok(()));
        // Not verified: any `v1` passes here, the body decides.
        assert_eq!(check_header(Some("t=1700000000,v1=00"), tolerance, NOW + 300), Ok(()));
        assert_eq!(check_header(None, tolerance, NOW), Err(Refused::NoSignature));
        let malformed = Err(Refused::Signature(SignatureError::MalformedHeader));
        for header in ["", "v1=00", "t=1700000000", "t=abc,v1=00"] {
            assert_eq!(check_header(Some(header), tolerance, NOW), malformed, "{header}");
        }
        let outside = Err(Refused::Signature(SignatureError::OutsideTolerance));
        assert_eq!(check_header(Some(&good), tolerance, NOW + 301), outside);
        assert_eq!(check_header(Some(&good), tolerance, NOW - 301), outside);
        // A header that `verify` would refuse for its size is refused before the body too.
        let flood = format!("t={NOW}{}", ",v1=00".repeat(signature::MAX_SIGNATURES + 1));
        let too_many = Err(Refused::Signature(SignatureError::TooManySignatures));
        assert_eq!(check_header(Some(&flood), tolerance, NOW), too_many);
    }

    #[test]
    fn a_signed_charge_event_is_read_with_its_downstream_key() {
        let body = event("charge.succeeded");
        let read = check(&body, &signature::sign(SECRET, NOW, &body)).unwrap();
        assert_eq!(read.id, "evt_1");
        assert_eq!(read.event_type, ChargeEventType::Succeeded);
        assert_eq!(read.charge.id, "ch_1");
        assert_eq!(read.downstream_key.as_deref(), Some("pay_1/charge"));
    }

    #[test]
    fn a_bad_signature_an_old_timestamp_or_no_header_is_refused_before_parsing() {
        let body = event("charge.succeeded");
        let other = signature::sign("whsec_other", NOW, &body);
        assert_eq!(check(&body, &other).err(), Some(Refused::Signature(SignatureError::NoMatch)));
        let old = signature::sign(SECRET, NOW - 301, &body);
        assert_eq!(
            check(&body, &old).err(),
            Some(Refused::Signature(SignatureError::OutsideTolerance))
        );
        let none = verify(&body, None, SECRET, signature::DEFAULT_TOLERANCE, NOW);
        assert_eq!(none.err(), Some(Refused::NoSignature));
        // Garbage with a bad signature is a signature problem, not a parse problem.
        assert_eq!(
            check(b"not json", &other).err(),
            Some(Refused::Signature(SignatureError::NoMatch))
        );
    }

    #[test]
    fn an_unknown_type_or_a_payload_that_is_no_charge_event_is_refused() {
        let body = event("customer.created");
        let refused = check(&body, &signature::sign(SECRET, NOW, &body)).err();
        assert_eq!(refused, Some(Refused::UnknownType("customer.created".into())));
        for body in [
            b"not json".to_vec(),
            br#"{"id":"evt_1","object":"event","type":"charge.succeeded","created":1,"data":{"object":{}}}"#.to_vec(),
            br#"{"id":"x_1","object":"event","type":"charge.succeeded","created":1,"data":{"object":{}}}"#.to_vec(),
        ] {
            let refused = check(&body, &signature::sign(SECRET, NOW, &body)).err();
            assert!(matches!(refused, Some(Refused::Malformed(_))), "{refused:?}");
        }
    }
}
