//! Reads of the recorded events: the charge a downstream key made, a successful charge the
//! payment does not record, and how many events were received.

use provider::Charge;
use sqlx::PgExecutor;

use super::extra_charge::ExtraCharge;
use crate::DomainError;
use crate::ids::PaymentId;

/// A successful charge the processor reported for `payment_id` other than `recorded`, the one the
/// payment records (`None`: it records none, so any): for the phase that records the payment's
/// outcome, which holds the payment's row, as [`receive`] does for news that lands afterwards.
///
/// [`receive`]: super::receive
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
