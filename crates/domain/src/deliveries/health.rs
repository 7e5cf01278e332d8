//! An endpoint's health, as Stripe keeps it: an endpoint that keeps failing is paused, then
//! disabled, and the account is told.
//!
//! Every attempt's outcome is recorded on the endpoint: a 2xx starts it afresh, a failure counts
//! one more in a row. After [`HealthRules::pause_after_failures`] failures in a row spanning at
//! least [`HealthRules::pause_after`], the endpoint is paused for [`HealthRules::pause`]: its
//! deliveries are deferred, not attempted (the claim skips it). When the pause ends, one delivery
//! is tried (the probe; the claim lets one run at a time): a success ends the pause, a failure
//! pauses it again, twice as long each time, at most [`HealthRules::longest_pause`]. Failing for
//! [`HealthRules::disable_after`] in all, it is disabled, and the event
//! `webhook_endpoint.disabled` is recorded in the same transaction; its deliveries are then
//! dropped unsent, and the account enables it again with an update
//! (`POST /v1/webhook_endpoints/{id}` `{"disabled": false}`), which starts its health afresh.

use std::time::Duration;

use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::events::{self, EventType};
use crate::ids::{AccountId, WebhookEndpointId};
use crate::webhooks;

/// When a failing endpoint is paused and disabled (the `webhooks.*` settings of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthRules {
    /// Failures in a row before a pause.
    pub pause_after_failures: u32,
    /// ...and failing for at least this long.
    pub pause_after: Duration,
    /// The first pause; each failed probe doubles it.
    pub pause: Duration,
    /// The longest pause.
    pub longest_pause: Duration,
    /// Failing this long in all, the endpoint is disabled.
    pub disable_after: Duration,
}

/// What a failure did to its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureRecorded {
    /// Counted; deliveries go on.
    Counted,
    /// Paused: no delivery is tried before the probe, this long from now.
    Paused {
        /// Until the probe.
        probe_in: Duration,
    },
    /// Disabled now, and the event recorded.
    Disabled,
    /// The endpoint is disabled or deleted already: nothing recorded.
    Closed,
}

/// Records a delivered attempt: the endpoint is healthy again (no write when it was).
pub async fn delivered(
    executor: impl PgExecutor<'_>,
    endpoint_id: &WebhookEndpointId,
) -> Result<(), DomainError> {
    sqlx::query!(
        r#"UPDATE webhook_endpoints
              SET consecutive_failures = 0, failing_since = NULL, paused_until = NULL, pauses = 0
            WHERE id = $1 AND (consecutive_failures > 0 OR paused_until IS NOT NULL)"#,
        endpoint_id as &WebhookEndpointId,
    )
    .execute(executor)
    .await?;
    Ok(())
}

/// Records a failed attempt (in the caller's transaction): counts it, and pauses or disables the
/// endpoint as `rules` say. A disable records the event `webhook_endpoint.disabled` (the endpoint
/// as the API shows it) in the same transaction, and so stages its delivery to the account's
/// other endpoints that take it.
pub async fn failed(
    conn: &mut PgConnection,
    endpoint_id: &WebhookEndpointId,
    rules: &HealthRules,
) -> Result<FailureRecorded, DomainError> {
    let ms = |d: Duration| d.as_millis() as f64;
    // A pause or a disable is decided on the row as it is before this failure, locked: the first
    // failure of a run (no `failing_since` yet) never decides either. A failure of a delivery
    // started before a pause (or while a probe ran) does not pause it again.
    let row = sqlx::query!(
        r#"
        WITH now_failing AS (
            SELECT id,
                   coalesce(failing_since <= now() - $5 * interval '1 millisecond', false)
                       AS disable,
                   coalesce((paused_until IS NULL OR paused_until <= now())
                            AND consecutive_failures + 1 >= $2
                            AND failing_since <= now() - $3 * interval '1 millisecond', false)
                       AS pause,
                   least($6, $4 * power(2, least(pauses, 40))) AS pause_ms
              FROM webhook_endpoints
             WHERE id = $1 AND status = 'enabled' AND deleted_at IS NULL
               FOR UPDATE
        )
        UPDATE webhook_endpoints w
           SET consecutive_failures = w.consecutive_failures + 1,
               failing_since = coalesce(w.failing_since, now()),
               status = CASE WHEN f.disable THEN 'disabled' ELSE w.status END,
               paused_until = CASE WHEN f.pause AND NOT f.disable
                                   THEN now() + f.pause_ms * interval '1 millisecond'
                                   ELSE w.paused_until END,
               pauses = CASE WHEN f.pause AND NOT f.disable THEN w.pauses + 1 ELSE w.pauses END
          FROM now_failing f
         WHERE w.id = f.id
        RETURNING w.account_id AS "account_id: AccountId", f.disable AS "disable!",
                  f.pause AS "pause!", f.pause_ms AS "pause_ms!"
        "#,
        endpoint_id as &WebhookEndpointId,
        i32::try_from(rules.pause_after_failures).unwrap_or(i32::MAX),
        ms(rules.pause_after),
        ms(rules.pause),
        ms(rules.longest_pause),
        ms(rules.disable_after),
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(FailureRecorded::Closed) };
    if row.disable {
        let endpoint = webhooks::find(&mut *conn, &row.account_id, endpoint_id)
            .await?
            .ok_or(DomainError::NotFound("webhook endpoint"))?;
        let object = endpoint.to_value(false).to_string().into_bytes();
        events::record(conn, &row.account_id, EventType::WebhookEndpointDisabled, &object).await?;
        return Ok(FailureRecorded::Disabled);
    }
    if row.pause {
        let probe_in = Duration::from_millis(row.pause_ms.max(0.0) as u64);
        return Ok(FailureRecorded::Paused { probe_in });
    }
    Ok(FailureRecorded::Counted)
}
