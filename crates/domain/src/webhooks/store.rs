//! The endpoints' SQL: register one under the account's bound, read, list, disable or delete
//! them, read what a delivery job needs, and seal their secrets again under a new key.

use sqlx::{Acquire as _, PgConnection, PgExecutor, PgPool};

use super::{
    EnabledEvents, Endpoint, EndpointStatus, MAX_ENDPOINTS_PER_ACCOUNT, SealedSecret, SealingKeys,
    SigningSecret,
};
use crate::DomainError;
use crate::events::{Event, EventRow, EventType};
use crate::ids::{AccountId, EventId, WebhookEndpointId};

/// Registers an endpoint with a fresh secret, sealed with `keys`. The URL must have passed
/// [`AddressRule::check_url`].
///
/// [`AddressRule::check_url`]: super::AddressRule::check_url
pub async fn create(
    conn: &mut PgConnection,
    keys: &SealingKeys,
    account_id: &AccountId,
    url: &url::Url,
    enabled_events: &EnabledEvents,
) -> Result<Endpoint, DomainError> {
    let id = WebhookEndpointId::generate();
    let secret = keys.seal(&SigningSecret::generate(), &id);
    // The account's row lock first, in a statement of its own, then the count and the insert: a
    // statement reads what committed before it began, so a count in the statement that waited
    // for the lock would miss an endpoint a concurrent creation committed meanwhile, and both
    // would pass the bound. In a transaction of their own (a savepoint in a phase's), so that
    // the lock holds until the insert is committed.
    let mut tx = conn.begin().await?;
    sqlx::query!("SELECT id FROM accounts WHERE id = $1 FOR UPDATE", account_id as &AccountId)
        .fetch_optional(&mut *tx)
        .await?;
    let endpoint = sqlx::query_as!(
        Endpoint,
        r#"
        INSERT INTO webhook_endpoints (id, account_id, url, enabled_events, secret)
        SELECT $1, accounts.id, $3, $4, $5 FROM accounts
         WHERE accounts.id = $2
           AND (SELECT count(*) FROM webhook_endpoints
                 WHERE account_id = $2 AND deleted_at IS NULL) < $6
        RETURNING id AS "id: _", account_id AS "account_id: _", url,
                  enabled_events AS "enabled_events: _", secret AS "secret: _",
                  status AS "status: _",
                  extract(epoch FROM created_at)::bigint AS "created!"
        "#,
        &id as &WebhookEndpointId,
        account_id as &AccountId,
        url.as_str(),
        enabled_events as &EnabledEvents,
        &secret as &SealedSecret,
        MAX_ENDPOINTS_PER_ACCOUNT,
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| DomainError::Invalid {
        param: "url",
        message: format!(
            "An account has at most {MAX_ENDPOINTS_PER_ACCOUNT} webhook endpoints; delete one first."
        ),
    })?;
    tx.commit().await?;
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
                  enabled_events AS "enabled_events: _", secret AS "secret: _",
                  status AS "status: _",
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
                  enabled_events AS "enabled_events: _", secret AS "secret: _",
                  status AS "status: _",
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

/// Sets an endpoint's status; `None` when the account has no such endpoint. Its health starts
/// afresh (`crate::deliveries::health`): an endpoint the worker disabled, enabled again, is not
/// paused or disabled by the failures it had before.
pub async fn set_status(
    executor: impl PgExecutor<'_>,
    account_id: &AccountId,
    id: &WebhookEndpointId,
    status: EndpointStatus,
) -> Result<Option<Endpoint>, DomainError> {
    let endpoint = sqlx::query_as!(
        Endpoint,
        r#"UPDATE webhook_endpoints
              SET status = $3, consecutive_failures = 0, failing_since = NULL,
                  paused_until = NULL, pauses = 0
            WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL
        RETURNING id AS "id: _", account_id AS "account_id: _", url,
                  enabled_events AS "enabled_events: _", secret AS "secret: _",
                  status AS "status: _",
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
                  w.secret AS "secret?: SealedSecret", w.status AS "status?: EndpointStatus",
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

/// Seals again with the current key every signing secret an old key sealed, a batch of at most
/// `batch` rows per transaction; returns how many were sealed again. Once it has run, and
/// `idempotency.retention_hours` have passed since the key was replaced (stored answers of
/// creations hold secrets sealed under it until they expire), the old key can be dropped from
/// `webhooks.old_sealing_keys`. A secret that does not open stops it with the error.
pub async fn reseal(pool: &PgPool, keys: &SealingKeys, batch: i64) -> Result<u64, DomainError> {
    let current = keys.current_id();
    let mut resealed = 0;
    loop {
        let mut tx = pool.begin().await?;
        let rows = sqlx::query!(
            r#"SELECT id AS "id: WebhookEndpointId", secret AS "secret: SealedSecret"
                 FROM webhook_endpoints
                WHERE substring(secret FROM 2 FOR 4) <> $1
                ORDER BY id LIMIT $2 FOR UPDATE"#,
            current.as_bytes(),
            batch,
        )
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            return Ok(resealed);
        }
        for row in rows {
            let secret = keys.open(&row.secret, &row.id)?;
            let sealed = keys.seal(&secret, &row.id);
            sqlx::query!(
                "UPDATE webhook_endpoints SET secret = $2 WHERE id = $1",
                &row.id as &WebhookEndpointId,
                &sealed as &SealedSecret,
            )
            .execute(&mut *tx)
            .await?;
            resealed += 1;
        }
        tx.commit().await?;
    }
}
