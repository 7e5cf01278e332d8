//! The engine's errors.

/// What can go wrong in the engine itself.
#[derive(Debug, thiserror::Error)]
pub enum IdemError {
    /// The database failed, after bounded retries of serialization failures and deadlocks.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The key's recovery point is not one the operation defines: the operation changed under a
    /// key in flight, or the row was edited by hand. Never guessed at.
    #[error("unknown recovery point `{0}` for this operation")]
    UnknownRecoveryPoint(String),
    /// Another process holds the key now; this holder must stop without side effects.
    #[error("the lease on the idempotency key was lost")]
    LeaseLost,
    /// A stored value does not have the shape the engine writes.
    #[error("corrupt idempotency record: {0}")]
    Corrupt(&'static str),
    /// The claim kept racing with other requests for the same key beyond the retry bound.
    #[error("the idempotency key is contended")]
    Contended,
}

impl IdemError {
    /// Whether the engine gave up waiting rather than failed: no connection (pooled or kept) within
    /// the acquire timeout, or a statement stopped by `lock_timeout` (55P03) or
    /// `statement_timeout` (57014). Nothing was stored; the request may be retried at once.
    pub fn timed_out(&self) -> bool {
        matches!(self, Self::Database(err) if gave_up(err))
    }
}

/// A unique violation on the key: another request stored the same key while this statement ran,
/// and the statement's whole transaction rolled back; sent again, a claim reads that key.
pub(crate) fn stored_meanwhile(err: &sqlx::Error) -> bool {
    err.as_database_error().is_some_and(|db| {
        db.code().as_deref() == Some("23505")
            && db.constraint() == Some("idempotency_keys_account_key")
    })
}

/// Whether a statement gave up waiting: see [`IdemError::timed_out`].
pub(crate) fn gave_up(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut => true,
        err => err
            .as_database_error()
            .and_then(|db| db.code())
            .is_some_and(|code| matches!(code.as_ref(), "55P03" | "57014")),
    }
}

/// How a phase failed.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError<E> {
    /// The fence refused the commit: the lease was taken over. Everything the phase wrote was
    /// rolled back.
    #[error("the lease on the idempotency key was lost")]
    LeaseLost,
    /// The key was new, and another request with the same key stored it first (the unique index
    /// decided): everything the phase wrote was rolled back.
    #[error("another request stored the idempotency key first")]
    Superseded,
    /// The database failed; the phase was rolled back.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The phase's own code gave up; the phase was rolled back.
    #[error(transparent)]
    Operation(E),
}

impl<E> PhaseError<E> {
    /// Whether the phase gave up waiting, having written nothing: no connection within the
    /// acquire timeout, or its statement stopped by `lock_timeout` or `statement_timeout`.
    pub fn timed_out(&self) -> bool {
        matches!(self, Self::Database(err) if gave_up(err))
    }
}

/// Whether the database refused a transaction for a conflict with another one that is running: a
/// serialization failure (40001) or a deadlock (40P01). It rolled back whole, and running it again
/// may succeed. (A unique violation is not one: run again, it mostly fails again, unless it is the
/// key's own, which the engine reads as another request having stored the key first.)
pub(crate) fn conflicted(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| matches!(code.as_ref(), "40001" | "40P01"))
}

/// Whether an error is one Postgres asks us to simply try again: a serialization failure
/// (40001), a deadlock (40P01), or a unique violation caused by a concurrent insert (23505).
pub fn is_retryable(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| matches!(code.as_ref(), "40001" | "40P01" | "23505"))
}
