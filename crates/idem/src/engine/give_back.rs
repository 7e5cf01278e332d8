//! Giving a key back ([`Engine::give_back`]): a lease this process holds, or may hold, and cannot
//! use any more is released at once, so that a retry resumes the key instead of meeting `409`
//! until the lease runs out. A lease is given back after a step failed for a reason that may pass
//! (`Lease::release_for`), and when the process cannot know whether the database granted it: a
//! takeover or a new key's first statement whose answer was lost.
//!
//! The database may not be there to ask: when it ends the sessions (a restart, a failover,
//! `pg_terminate_backend`), the pool's other connections are ended too, and the next one taken
//! fails as the step did. So a give-back that meets a lost connection is tried again in the
//! background, each time on a connection of its own, until the lease would have run out anyway.
//! And a grant whose answer was lost may still be committing in the server: a give-back that
//! finds nothing looks once more when any such statement must have ended.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::time::Instant;
use uuid::Uuid;

use super::Engine;
use crate::connections::connection_lost;
use crate::observe::Event;
use crate::store;

/// The key to give back, and how it is found.
#[derive(Debug, Clone)]
pub(super) enum Holding {
    /// A stored key, by its id.
    Stored {
        /// The key's id.
        key_id: i64,
    },
    /// A key a first statement may have stored, whose id the engine never learnt: by the account
    /// and the key.
    New {
        /// The key's account.
        account: String,
        /// The key.
        key: String,
    },
}

/// What to give back: the key, the lease's token, why, and when the completer may try it next.
#[derive(Debug, Clone)]
pub(super) struct GiveBack {
    pub(super) holding: Holding,
    pub(super) token: Uuid,
    pub(super) reason: String,
    pub(super) retry_in: Duration,
}

/// The first pause before a give-back is tried again on a connection of its own; it doubles up
/// to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Give-backs that make connections of their own at once, in the whole process: a database that
/// ended its connections is not flooded with new ones by every lease that waits to be given back.
static OWN_CONNECTIONS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// How a give-back goes on in the background.
#[derive(Debug, Clone, Copy)]
struct Later {
    /// Before the first try; doubles up to [`MAX_PAUSE`] after each that could not ask.
    pause: Duration,
    /// Tries stop once this has passed: the lease has run out by then.
    within: Duration,
    /// When a try that found nothing looks once more, if it came before then: the statement
    /// that may have granted the lease must have ended by then.
    look_again_at: Option<Instant>,
    /// On a connection of its own (the pool's were ended), or on the pool (it had none free).
    own_connection: bool,
}

impl Engine {
    /// Gives `back` the key at once. `Some(released)` when the database answered (`false`: the
    /// token does not hold the key); `None` when it could not be asked, and the give-back goes on
    /// in the background. With `look_again`, a give-back that found nothing looks once more when
    /// the statement that may have granted the lease must have ended (`claim_timeout` bounds its
    /// waits).
    pub(super) async fn give_back(&self, back: GiveBack, look_again: bool) -> Option<bool> {
        let ended = self.config.claim_timeout * 2 + Duration::from_millis(100);
        let look_again_at = look_again.then(|| Instant::now() + ended);
        let answered = match self.pool.acquire().await {
            Ok(mut pooled) => give_back_on(&mut pooled, &back).await,
            Err(err) => Err(err),
        };
        let later = |pause, own_connection| {
            let within = self.config.lease;
            Later { pause, within, look_again_at, own_connection }
        };
        match answered {
            Ok(true) => {
                self.observer.event(Event::Released);
                Some(true)
            }
            Ok(false) => {
                if look_again {
                    let once = Later { look_again_at: None, ..later(ended, false) };
                    self.give_back_later(back, Later { within: ended, ..once });
                }
                Some(false)
            }
            Err(err) if connection_lost(&err) => {
                tracing::warn!(error = %err, "could not give a key back: trying again on connections of its own");
                self.give_back_later(back, later(FIRST_PAUSE, true));
                None
            }
            Err(sqlx::Error::PoolTimedOut) => {
                tracing::warn!("could not give a key back: no pooled connection; trying again");
                self.give_back_later(back, later(FIRST_PAUSE, false));
                None
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not give a key back; it is resumed when its lease expires");
                None
            }
        }
    }

    /// Tries to give `back` the key as `later` says, until the database answers (and, if it found
    /// nothing too early, once more) or the lease has run out.
    fn give_back_later(&self, back: GiveBack, later: Later) {
        let engine = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + later.within;
            let mut pause = later.pause;
            let mut look_again_at = later.look_again_at;
            loop {
                tokio::time::sleep(pause).await;
                let tried = if later.own_connection {
                    engine.give_back_on_its_own(&back).await
                } else {
                    match engine.pool.acquire().await {
                        Ok(mut pooled) => give_back_on(&mut pooled, &back).await,
                        Err(err) => Err(err),
                    }
                };
                match tried {
                    Ok(true) => {
                        engine.observer.event(Event::Released);
                        tracing::info!(reason = %back.reason, "a key was given back late");
                        return;
                    }
                    Ok(false) => match look_again_at.take() {
                        Some(at) if Instant::now() < at => {
                            tokio::time::sleep_until(at).await;
                            pause = Duration::ZERO;
                            continue;
                        }
                        _ => return,
                    },
                    Err(err) if Instant::now() + pause < deadline => {
                        tracing::debug!(error = %err, "the database cannot give a key back yet");
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "could not give a key back before its lease ran out");
                        return;
                    }
                }
                pause = (pause * 2).clamp(FIRST_PAUSE, MAX_PAUSE);
            }
        });
    }

    /// One give-back on a connection made for it (not one of the pool's, which the server may
    /// have ended too), bounded by the pool's acquire timeout.
    async fn give_back_on_its_own(&self, back: &GiveBack) -> Result<bool, sqlx::Error> {
        let _one_of_few = OWN_CONNECTIONS.acquire().await.map_err(|_| sqlx::Error::PoolClosed)?;
        let options = self.pool.connect_options();
        let timeout = self.pool.options().get_acquire_timeout();
        let mut connection: PgConnection = tokio::time::timeout(timeout, options.connect())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)??;
        let released = give_back_on(&mut connection, back).await;
        let _ = connection.close().await;
        released
    }
}

/// Releases the key `back` names if its token holds it, keeping its recovery point.
async fn give_back_on(connection: &mut PgConnection, back: &GiveBack) -> Result<bool, sqlx::Error> {
    let reason = &back.reason;
    match &back.holding {
        Holding::Stored { key_id } => {
            let retry_in_ms = i64::try_from(back.retry_in.as_millis()).unwrap_or(i64::MAX);
            store::release(connection, *key_id, back.token, reason, retry_in_ms).await
        }
        Holding::New { account, key } => {
            store::release_unheld(connection, account, key, back.token, reason).await
        }
    }
}
