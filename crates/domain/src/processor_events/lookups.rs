//! Reads of the recorded events: the PaymentIntent a downstream key made, a successful charge or
//! PaymentIntent the payment does not record, and how many events were received.

use provider::PaymentIntent;
use sqlx::PgExecutor;

use super::extra_charge::ExtraCharge;
use crate::DomainError;
use crate::ids::PaymentId;

/// What a payment records of the processor's objects, to tell another one from it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Recorded<'a> {
    /// Its charge (`ch_…`).
    pub charge: Option<&'a str>,
    /// Its PaymentIntent (`pi_…`).
    pub intent: Option<&'a str>,
}

/// A success the processor reported for `payment_id` (a charge that succeeded, a PaymentIntent
/// that succeeded or was authorized) other than the ones the payment records (`recorded`; none
/// recorded: any): for the phase that records the payment's outcome, which holds the payment's
/// row, as [`receive`] does for news that lands afterwards.
///
/// [`receive`]: super::receive
pub async fn other_succeeded_charge(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
    recorded: Recorded<'_>,
) -> Result<Option<ExtraCharge>, DomainError> {
    let row = sqlx::query!(
        r#"SELECT object_id, downstream_key FROM processor_events
            WHERE payment_id = $1
              AND ((type = 'charge.succeeded' AND object_id IS DISTINCT FROM $2
                    AND (object->>'payment_intent') IS DISTINCT FROM $3)
                   OR (type IN ('payment_intent.succeeded',
                                'payment_intent.amount_capturable_updated')
                       AND object_id IS DISTINCT FROM $3))
            ORDER BY created, received_at LIMIT 1"#,
        payment_id as &PaymentId,
        recorded.charge,
        recorded.intent,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|r| ExtraCharge {
        charge_id: r.object_id,
        downstream_key: r.downstream_key,
        recorded: recorded.charge.or(recorded.intent).map(str::to_owned),
    }))
}

/// The PaymentIntent the processor says the call under `downstream_key` made, as its latest event
/// about it reported it, if an event told us.
pub async fn intent_for_key(
    executor: impl PgExecutor<'_>,
    downstream_key: &str,
) -> Result<Option<PaymentIntent>, DomainError> {
    let row = sqlx::query!(
        r#"SELECT object FROM processor_events
            WHERE downstream_key = $1
              AND type IN ('payment_intent.succeeded', 'payment_intent.payment_failed',
                           'payment_intent.amount_capturable_updated',
                           'payment_intent.requires_action')
            ORDER BY created DESC, received_at DESC LIMIT 1"#,
        downstream_key,
    )
    .fetch_optional(executor)
    .await?;
    row.map(|r| serde_json::from_value(r.object))
        .transpose()
        .map_err(|_| DomainError::Corrupt("processor_events.object"))
}

/// A success the processor reported for `payment_id` under a downstream key other than
/// `downstream_key` (an earlier generation of it), as `(its object's id, that key)`.
pub async fn paid_under_another_key(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
    downstream_key: &str,
) -> Result<Option<(String, String)>, DomainError> {
    let row = sqlx::query!(
        r#"SELECT object_id, downstream_key AS "downstream_key!" FROM processor_events
            WHERE payment_id = $1
              AND type IN ('charge.succeeded', 'payment_intent.succeeded',
                           'payment_intent.amount_capturable_updated')
              AND downstream_key IS NOT NULL AND downstream_key <> $2
            ORDER BY created, received_at LIMIT 1"#,
        payment_id as &PaymentId,
        downstream_key,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|r| (r.object_id, r.downstream_key)))
}

/// How many events were received (for tests and the inspector).
pub async fn count(executor: impl PgExecutor<'_>) -> Result<i64, DomainError> {
    let row = sqlx::query!(r#"SELECT count(*) AS "count!" FROM processor_events"#)
        .fetch_one(executor)
        .await?;
    Ok(row.count)
}
