//! A request's read of its key, and the takeover of a free or expired lease.

use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::StoredResponse;
use crate::error::IdemError;

/// A key row as the claim sees it.
#[derive(Debug)]
pub(crate) struct KeyRow {
    pub id: i64,
    pub fingerprint: Vec<u8>,
    pub request_method: String,
    pub request_path: String,
    pub request_id: String,
    pub operation: String,
    /// The operation's input, read only for a key that is not finished: a replay never needs
    /// it, so the read leaves it behind rather than send and decode it.
    pub request_params: Option<Value>,
    pub owner_token: Option<Uuid>,
    /// `locked_until > now()`, by the database clock.
    pub lease_active: bool,
    pub needs_human: bool,
    pub response: Option<StoredResponse>,
    /// When the key was finished, in microseconds since the Unix epoch by the database clock.
    pub completed_at_us: Option<i64>,
}

/// What the claim reads by.
#[derive(Debug, Clone)]
pub(crate) struct Lookup {
    pub account_id: String,
    /// The SHA-256 digest of the API key the request presents, when the claim must also check
    /// that it is a live key of `account_id` (see `read`).
    pub credential: Option<Vec<u8>>,
    pub key: String,
}

/// What the claim's read saw, and the credentials' version in the same snapshot.
#[derive(Debug)]
pub(crate) struct Read {
    pub seen: Seen,
    /// `credentials_version` as the statement saw it: a credential the statement found live stays
    /// live for as long as the version has not changed (see `answers.rs`).
    pub version: Uuid,
    /// The database clock, in microseconds since the Unix epoch.
    pub now_us: i64,
}

/// What the claim's read saw of the key.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // matched at once by the caller; a box would only allocate
pub(crate) enum Seen {
    /// The key row.
    Key(KeyRow),
    /// No such key (committed): the id reserved for it, should this request store it.
    Absent(i64),
    /// The credential is not a live API key of the account: nothing was read.
    Unauthenticated,
}

/// Reads the key: one statement, one round trip, that writes nothing. With a credential, the same
/// statement first checks it against `api_keys` (the one table the engine reads that is not its
/// own), so that a request whose account is already known costs no separate authentication round
/// trip, and a revoked key reads nothing. A key that is not there gets an id reserved from the
/// table's sequence (a sequence is not transactional: this neither writes a row nor takes a
/// transaction id), which the first phase stores it under. The credentials' version comes with it,
/// read in the same snapshot as the credential.
pub(crate) async fn read(
    executor: impl PgExecutor<'_>,
    lookup: &Lookup,
) -> Result<Read, IdemError> {
    let row = sqlx::query!(
        r#"
        WITH principal AS (
            SELECT 1 AS live
             WHERE $3::bytea IS NULL
                OR EXISTS (SELECT 1 FROM api_keys
                            WHERE key_hash = $3 AND account_id = $1 AND revoked_at IS NULL)
        ),
        version AS (SELECT version FROM credentials_version)
        SELECT v.version AS "version!", (extract(epoch FROM now()) * 1000000)::int8 AS "now_us!",
               p.live AS "live?", k.id AS "id?", k.fingerprint AS "fingerprint?",
               k.request_method AS "request_method?", k.request_path AS "request_path?",
               k.request_id AS "request_id?", k.operation AS "operation?",
               CASE WHEN k.response_status IS NULL THEN k.request_params END AS "request_params?",
               k.owner_token AS "owner_token?",
               coalesce(k.locked_until > now(), false) AS "lease_active!",
               k.needs_human_at IS NOT NULL AS "needs_human!",
               k.response_status AS "response_status?", k.response_headers AS "response_headers?",
               k.response_body AS "response_body?",
               (extract(epoch FROM k.completed_at) * 1000000)::int8 AS "completed_at_us?",
               CASE WHEN p.live IS NOT NULL AND k.id IS NULL
                    THEN nextval('idempotency_keys_id_seq') END AS "reserved?"
          FROM version v
          LEFT JOIN principal p ON true
          LEFT JOIN idempotency_keys k
                 ON p.live IS NOT NULL AND k.account_id = $1 AND k.idempotency_key = $2
        "#,
        lookup.account_id,
        lookup.key,
        lookup.credential.as_deref(),
    )
    .fetch_one(executor)
    .await?;
    let (version, now_us) = (row.version, row.now_us);
    if row.live.is_none() {
        return Ok(Read { seen: Seen::Unauthenticated, version, now_us });
    }
    let Some(id) = row.id else {
        return Ok(Read { seen: Seen::Absent(present(row.reserved)?), version, now_us });
    };
    // The key's own columns are NOT NULL: with an id, all of them are present.
    let response = stored_response(row.response_status, row.response_headers, row.response_body)?;
    let seen = Seen::Key(KeyRow {
        id,
        fingerprint: present(row.fingerprint)?,
        request_method: present(row.request_method)?,
        request_path: present(row.request_path)?,
        request_id: present(row.request_id)?,
        operation: present(row.operation)?,
        request_params: row.request_params,
        owner_token: row.owner_token,
        lease_active: row.lease_active,
        needs_human: row.needs_human,
        response,
        completed_at_us: row.completed_at_us,
    });
    Ok(Read { seen, version, now_us })
}

/// The credentials' version and the database clock (microseconds since the Unix epoch), read by a
/// statement of its own: what a replay answered from memory waits for (`answers.rs`).
pub(crate) async fn fresh(executor: impl PgExecutor<'_>) -> Result<(Uuid, i64), IdemError> {
    let row = sqlx::query!(
        r#"SELECT version, (extract(epoch FROM now()) * 1000000)::int8 AS "now_us!"
             FROM credentials_version"#
    )
    .fetch_one(executor)
    .await?;
    Ok((row.version, row.now_us))
}

/// What a takeover did.
#[derive(Debug)]
pub(crate) enum TakeOver {
    /// The lease is ours: the key's recovery point and attempts.
    Taken(String, i32),
    /// The key is older than the processor's window: flagged for a person instead, untouched
    /// otherwise.
    Flagged,
    /// Someone else took or finished the key since it was read.
    Missed,
}

/// Takes the lease of an unfinished key whose lease is free or expired, if nobody changed the
/// owner since `observed` was read (compare and swap), and records the attempt for `request_id`.
/// A key created more than `window_ms` ago is flagged for a person instead: no one may drive it
/// again (the processor has forgotten its downstream keys).
pub(crate) async fn take_over(
    executor: impl PgExecutor<'_>,
    key_id: i64,
    observed: Option<Uuid>,
    token: Uuid,
    lease_ms: i64,
    request_id: &str,
    window_ms: Option<i64>,
) -> Result<TakeOver, IdemError> {
    let row = sqlx::query!(
        r#"
        WITH free AS (
            SELECT id, $6::float8 IS NOT NULL
                       AND created_at < now() - $6 * interval '1 millisecond' AS too_old
              FROM idempotency_keys
             WHERE id = $1
               AND owner_token IS NOT DISTINCT FROM $2
               AND completed_at IS NULL AND needs_human_at IS NULL
               AND (locked_until IS NULL OR locked_until <= now())
               FOR UPDATE
        ), taken AS (
            UPDATE idempotency_keys k
               SET owner_token = $3, locked_until = now() + $4 * interval '1 millisecond',
                   attempts = k.attempts + 1, last_run_at = now()
              FROM free
             WHERE k.id = free.id AND NOT free.too_old
            RETURNING k.id, k.recovery_point, k.attempts
        ), flagged AS (
            UPDATE idempotency_keys k
               SET needs_human_at = now(), owner_token = NULL, locked_until = NULL,
                   last_error = 'older than the processor''s idempotency window'
                                || coalesce(' (last error: ' || k.last_error || ')', '')
              FROM free
             WHERE k.id = free.id AND free.too_old
            RETURNING k.id
        ), logged AS (
            INSERT INTO idempotency_attempts (key_id, attempt, request_id, took_over, recovery_point)
            SELECT id, attempts, $5, $2::uuid IS NOT NULL, recovery_point FROM taken
        )
        SELECT free.too_old AS "too_old!", taken.recovery_point AS "recovery_point?",
               taken.attempts AS "attempts?"
          FROM free LEFT JOIN taken ON true
        "#,
        key_id,
        observed,
        token,
        lease_ms as f64,
        request_id,
        window_ms.map(|ms| ms as f64),
    )
    .fetch_optional(executor)
    .await?;
    Ok(match row {
        None => TakeOver::Missed,
        Some(row) if row.too_old => TakeOver::Flagged,
        Some(row) => match (row.recovery_point, row.attempts) {
            (Some(point), Some(attempts)) => TakeOver::Taken(point, attempts),
            _ => return Err(IdemError::Corrupt("a free key that could not be taken")),
        },
    })
}

fn present<T>(column: Option<T>) -> Result<T, IdemError> {
    column.ok_or(IdemError::Corrupt("a claimed key row with a NULL column"))
}

fn stored_response(
    status: Option<i16>,
    headers: Option<Value>,
    body: Option<Vec<u8>>,
) -> Result<Option<StoredResponse>, IdemError> {
    match (status, headers, body) {
        (None, _, _) => Ok(None),
        (Some(status), headers, Some(body)) => {
            let headers = match headers {
                Some(headers) => serde_json::from_value(headers)
                    .map_err(|_| IdemError::Corrupt("response headers are not name/value pairs"))?,
                None => Vec::new(),
            };
            let status =
                u16::try_from(status).map_err(|_| IdemError::Corrupt("negative status"))?;
            Ok(Some(StoredResponse { status, headers, body }))
        }
        (Some(_), _, None) => Err(IdemError::Corrupt("a stored status without a body")),
    }
}
