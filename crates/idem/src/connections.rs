//! Side connections: a few connections the engine keeps beside the pool for one-statement phases,
//! lent to one statement at a time and given back without a check.
//!
//! sqlx's pool checks every connection with a round trip when it is given back
//! (`PoolConnection`'s release), because it cannot know whether the statement that used it ran
//! to its end or was cut off halfway by a dropped future. A new payment's two phases are one
//! statement each (`Lease::phase_in_one`), so that check was a third of their round trips. Here
//! the phase knows: a statement that returned (with rows or with an error the server sent) left
//! the connection ready for the next one (sqlx reads what is left of an answer before it sends
//! again), and the connection goes straight back; one whose statement was cut off (the phase's
//! future dropped) is checked in a task of its own, as the pool would, and closed if the check
//! fails. A connection that failed as a connection (no answer, the server ending the session) is
//! closed, and the next phase that needs one connects again.
//!
//! A connection that sat idle for a second or more is checked before it is lent, as the pool does
//! (`settings::DatabaseSettings::pool`): the server may have ended its session meanwhile (a
//! restart, a failover). Under load no connection sits idle that long, and none is checked.
//!
//! At most `count` connections are lent at once; a phase waits for one at most the pool's
//! acquire timeout, as it would for a pooled connection. The sessions are the pool's (its connect
//! options: its `statement_timeout` included). When the pool closes, the idle connections are
//! closed and no connection is taken back.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgDatabaseError, PgPool, PgSeverity};
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a connection may sit idle before it is checked again when lent: the pool's
/// `IDLE_RECHECK`.
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// The kept connections of one engine.
#[derive(Debug)]
pub(crate) struct SideConnections {
    /// The connections not lent, each with when it was given back.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    permits: Arc<Semaphore>,
    options: PgConnectOptions,
    acquire_timeout: Duration,
    pool: PgPool,
}

impl SideConnections {
    /// Keeps up to `count` connections made with `options` (the pool's, or the pool's with
    /// settings of their own), connected on first use. Must be called within a Tokio runtime: a
    /// task closes the idle ones when the pool closes.
    pub(crate) fn start(pool: &PgPool, count: usize, options: PgConnectOptions) -> Arc<Self> {
        let kept = Arc::new(Self {
            idle: Mutex::new(Vec::with_capacity(count)),
            permits: Arc::new(Semaphore::new(count)),
            options,
            acquire_timeout: pool.options().get_acquire_timeout(),
            pool: pool.clone(),
        });
        let weak = Arc::downgrade(&kept);
        let closing = pool.clone();
        tokio::spawn(async move {
            closing.close_event().await;
            if let Some(kept) = weak.upgrade() {
                kept.permits.close();
                let idle = std::mem::take(&mut *kept.lock_idle());
                for (connection, _) in idle {
                    let _ = connection.close().await;
                }
            }
        });
        kept
    }

    /// Lends a connection: an idle one, or a new one while fewer than `count` are open. Fails
    /// with `PoolTimedOut` when none came within the pool's acquire timeout, and with
    /// `PoolClosed` once the pool is closed.
    pub(crate) async fn lend(self: &Arc<Self>) -> Result<Lent, sqlx::Error> {
        let deadline = tokio::time::Instant::now() + self.acquire_timeout;
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)?;
        if self.pool.is_closed() {
            return Err(sqlx::Error::PoolClosed);
        }
        let idle = self.lock_idle().pop();
        let checked = match idle {
            Some((connection, since)) if since.elapsed() < IDLE_RECHECK => Some(connection),
            Some((mut connection, _)) => {
                let ping = tokio::time::timeout_at(deadline, connection.ping()).await;
                // One that does not answer is dropped (its socket closed), and another is made.
                matches!(ping, Ok(Ok(()))).then_some(connection)
            }
            None => None,
        };
        let reused = checked.is_some();
        let connection = match checked {
            Some(connection) => connection,
            None => tokio::time::timeout_at(deadline, self.options.connect())
                .await
                .map_err(|_| sqlx::Error::PoolTimedOut)??,
        };
        Ok(Lent { connection: Some(connection), reused, kept: self.clone(), permit: Some(permit) })
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<(PgConnection, Instant)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a connection back, or closes it when the pool has closed meanwhile. Checked under
    /// the lock the closing task drains the stack under: the pool is marked closed before that
    /// task wakes, so a connection is either drained by it or never pushed.
    fn take_back(&self, connection: PgConnection) {
        let mut idle = self.lock_idle();
        if self.pool.is_closed() {
            drop(idle);
            // Dropping it closes the socket; the server ends the session.
            drop(connection);
            return;
        }
        idle.push((connection, Instant::now()));
    }
}

/// A kept connection lent to one statement. Give it back with [`Lent::give_back`] once the
/// statement returned; dropped without that, it is checked before it is taken back.
#[derive(Debug)]
pub(crate) struct Lent {
    connection: Option<PgConnection>,
    /// Whether the connection had been lent before (not made for this statement).
    reused: bool,
    kept: Arc<SideConnections>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Lent {
    /// The connection, for one statement.
    pub(crate) fn connection(&mut self) -> &mut PgConnection {
        self.connection
            .as_mut()
            .unwrap_or_else(|| unreachable!("a lent connection is present until given back"))
    }

    /// Whether the connection had served an earlier statement: one that fails as a connection
    /// may have been ended by the server while it sat idle (a restart within the last second).
    pub(crate) fn reused(&self) -> bool {
        self.reused
    }

    /// The statement returned, with `error` if it failed: the connection goes back as it is,
    /// unless the error was the connection's own, which closes it.
    pub(crate) fn give_back(mut self, error: Option<&sqlx::Error>) {
        if let Some(connection) = self.connection.take()
            && !error.is_some_and(connection_lost)
        {
            self.kept.take_back(connection);
        }
        // The permit goes with `self`: the next phase may lend a connection (or connect one).
    }
}

impl Drop for Lent {
    /// Cut off: the statement may be half sent or its answer half read. The connection is
    /// checked with a round trip (which waits for the rest of the answer) in a task of its own,
    /// holding its permit, and taken back only if the check answered within the acquire timeout;
    /// otherwise it is closed, and the server ends the session.
    fn drop(&mut self) {
        let Some(mut connection) = self.connection.take() else { return };
        let (kept, permit) = (self.kept.clone(), self.permit.take());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let check = tokio::time::timeout(kept.acquire_timeout, connection.ping()).await;
                if matches!(check, Ok(Ok(()))) {
                    kept.take_back(connection);
                }
                drop(permit);
            });
        }
    }
}

/// A failure of the connection rather than of the statement: no answer, or no sense made of it
/// (I/O, TLS, the protocol), the server ending the session (SQLSTATE class 08, connection
/// exception, or 57P, the server shutting down or terminating the backend, or any error of
/// severity `FATAL` or `PANIC`, after which the server closes the session), or a session that can
/// no longer write (25006, read-only transaction: the node it reached is a standby now, after a
/// failover, and a new connection through the same address reaches the new primary). An error
/// in decoding a row the statement returned is none of these: the answer was read to its end.
pub(crate) fn connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let fatal = db
                .try_downcast_ref::<PgDatabaseError>()
                .is_some_and(|pg| matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic));
            let ended = db.code().is_some_and(|code| {
                code.starts_with("08") || code.starts_with("57P") || code == "25006"
            });
            fatal || ended
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::connection_lost;

    #[test]
    fn only_a_failure_of_the_connection_closes_it() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(connection_lost(&sqlx::Error::Io(io)));
        assert!(connection_lost(&sqlx::Error::Protocol("unexpected message".into())));
        // The answer was read to its end: the connection is as good as before.
        assert!(!connection_lost(&sqlx::Error::RowNotFound));
        assert!(!connection_lost(&sqlx::Error::ColumnNotFound("id".into())));
    }
}
