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

/// What the claim's read saw, and the credentials' version in the same snapshot.
#[derive(Debug)]
pub(crate) struct Read {
    pub seen: Seen,
    /// The credentials' version as the statement saw it: a credential the statement found live stays
    /// live for as long as the version has not changed (see `replay_cache.rs`).
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

/// What `idem_claim` answers (docs/schema.sql): the claim's read, or a
/// key stored by the statement that called it. An operation's first phase that claims its key
/// (`Engine::claim_first`) selects it as one column and hands it back to the engine unopened. sqlx
/// decodes the fields in the order they are declared: the order of the type's attributes.
#[derive(Debug, Clone, sqlx::Type)]
#[sqlx(type_name = "idem_claimed")]
pub struct Claimed {
    version: Option<Uuid>,
    now_us: Option<i64>,
    live: Option<bool>,
    id: Option<i64>,
    fingerprint: Option<Vec<u8>>,
    request_method: Option<String>,
    request_path: Option<String>,
    request_id: Option<String>,
    operation: Option<String>,
    request_params: Option<Value>,
    owner_token: Option<Uuid>,
    lease_active: Option<bool>,
    needs_human: Option<bool>,
    response_status: Option<i16>,
    response_headers: Option<Value>,
    response_body: Option<Vec<u8>>,
    completed_at_us: Option<i64>,
    reserved: Option<i64>,
    stored: Option<bool>,
}

/// What a call of `idem_claim` came to.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // matched at once by the caller; a box would only allocate
pub(crate) enum Claiming {
    /// The statement stored the key (new) or moved it (stored, fenced): its id, and, for a new
    /// key, the credentials' version the credential was found live at.
    Stored { id: i64, version: Option<Uuid> },
    /// It only read: the key is there, or the credential is not live.
    Read(Read),
}

impl Claimed {
    pub(crate) fn claiming(self) -> Result<Claiming, IdemError> {
        if self.stored == Some(true) {
            let id = present(self.id)?;
            return Ok(Claiming::Stored { id, version: self.version });
        }
        let (version, now_us) = (present(self.version)?, present(self.now_us)?);
        if self.live != Some(true) {
            return Ok(Claiming::Read(Read { seen: Seen::Unauthenticated, version, now_us }));
        }
        let Some(id) = self.id else {
            // No reservation: the caller's fence stored nothing though the key is absent, which
            // `idem_claim` never does.
            let reserved = self.reserved.ok_or(IdemError::Corrupt("an absent key not claimed"))?;
            return Ok(Claiming::Read(Read { seen: Seen::Absent(reserved), version, now_us }));
        };
        // The key's own columns are NOT NULL: with an id, all of them are present.
        let response =
            stored_response(self.response_status, self.response_headers, self.response_body)?;
        let seen = Seen::Key(KeyRow {
            id,
            fingerprint: present(self.fingerprint)?,
            request_method: present(self.request_method)?,
            request_path: present(self.request_path)?,
            request_id: present(self.request_id)?,
            operation: present(self.operation)?,
            request_params: self.request_params,
            owner_token: self.owner_token,
            lease_active: present(self.lease_active)?,
            needs_human: present(self.needs_human)?,
            response,
            completed_at_us: self.completed_at_us,
        });
        Ok(Claiming::Read(Read { seen, version, now_us }))
    }
}

/// Reads the key: one statement, one round trip, that writes nothing (`idem_claim` without a
/// fence). With a credential, the same statement first checks it (through `idem_credentials`, the
/// hook the domain defines: the engine names no table of its), so that a request whose account is known costs
/// no separate authentication round trip, and a revoked key reads nothing. A key that is not there
/// gets an id reserved from the table's sequence (a sequence is not transactional: this neither
/// writes a row nor takes a transaction id), which the first phase stores it under. The
/// credentials' version comes with it, read in the same snapshot as the credential.
pub(crate) async fn read(
    executor: impl PgExecutor<'_>,
    request: &crate::Request,
) -> Result<Read, IdemError> {
    let row = sqlx::query!(
        r#"SELECT idem_claim($1, $2, $3, NULL) AS "claimed!: Claimed""#,
        &*request.account_id,
        request.key.as_str(),
        request.credential.as_deref(),
    )
    .fetch_one(executor)
    .await?;
    match row.claimed.claiming()? {
        Claiming::Read(read) => Ok(read),
        Claiming::Stored { .. } => Err(IdemError::Corrupt("a read that stored a key")),
    }
}

/// The credentials' version and the database clock (microseconds since the Unix epoch), read by a
/// statement of its own: what a replay answered from memory waits for (`replay_cache.rs`).
pub(crate) async fn fresh(executor: impl PgExecutor<'_>) -> Result<(Uuid, i64), IdemError> {
    let row = sqlx::query!(
        r#"SELECT version AS "version!", (extract(epoch FROM now()) * 1000000)::int8 AS "now_us!"
             FROM idem_credentials(NULL, NULL)"#
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
