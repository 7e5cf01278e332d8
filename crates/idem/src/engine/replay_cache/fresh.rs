//! The shared read of the credentials' version and the database clock that replays answered from
//! memory wait for: one statement for every request that arrived while the last one ran.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::Engine;
use crate::store;

/// The shared read of the credentials' version and the database clock.
///
/// Reads are numbered as they begin. A request notes how many had begun when it asked
/// (`started`), so the first read that can serve it is the next one; it wakes the reader and
/// waits for that read's result. The reader runs one read at a time, back to back while anyone
/// waits: every request that arrived while a read was running shares the next one.
#[derive(Default)]
pub(super) struct Fresh {
    shared: Arc<Shared>,
    seen: OnceLock<watch::Sender<Seen>>,
}

#[derive(Default)]
struct Shared {
    /// Reads begun. Incremented before the read's statement is sent, so a read numbered above
    /// what a request saw began after the request arrived.
    started: AtomicU64,
    wanted: Notify,
}

/// The credentials' version and the database clock (microseconds since the Unix epoch).
pub(super) type Now = (Uuid, i64);

/// The result of the read numbered `read`: `None` when it failed.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    read: u64,
    fresh: Option<Now>,
}

/// What the reader's task runs: `read` for each read (the version and the clock, `None` when the
/// read failed), until `stop` completes (the engine's pool closed).
pub(super) struct Reader {
    pub(super) read: Box<dyn Fn() -> BoxFuture<'static, Option<Now>> + Send + Sync>,
    pub(super) stop: BoxFuture<'static, ()>,
}

impl Fresh {
    /// The credentials' version and the database clock, read after this call began; `None` when
    /// that read failed or did not come within `bound`. The first call starts the reader's task
    /// with `reader` (an engine that never replays, the worker's, never starts one).
    pub(super) async fn after_now(
        &self,
        reader: impl FnOnce() -> Reader,
        bound: Duration,
    ) -> Option<Now> {
        let mut seen = self.seen.get_or_init(|| self.start(reader())).subscribe();
        let wanted = self.shared.started.load(Ordering::SeqCst) + 1;
        self.shared.wanted.notify_one();
        let waited = tokio::time::timeout(bound, seen.wait_for(|seen| seen.read >= wanted)).await;
        let seen = *waited.ok()?.ok()?;
        seen.fresh
    }

    fn start(&self, reader: Reader) -> watch::Sender<Seen> {
        let (sender, _) = watch::channel(Seen::default());
        let (shared, results) = (self.shared.clone(), sender.clone());
        let Reader { read: read_once, mut stop } = reader;
        tokio::spawn(async move {
            loop {
                // A wake-up that came while a read ran is kept (one permit), so the next read
                // starts at once.
                tokio::select! {
                    () = shared.wanted.notified() => {}
                    () = &mut stop => return,
                }
                let read = shared.started.fetch_add(1, Ordering::SeqCst) + 1;
                // A read that panics fails that read, not the task: the requests waiting read
                // their keys, and the next read is tried.
                let fresh = AssertUnwindSafe(read_once()).catch_unwind().await.ok().flatten();
                results.send_replace(Seen { read, fresh });
            }
        });
        sender
    }
}

impl Engine {
    /// The shared read's task runs this: [`Engine::read_fresh`], bounded as a request's wait for
    /// it is (a read that outlasts every wait serves no one), until the pool is closed. The task
    /// holds a clone of the engine until then.
    pub(super) fn fresh_reader(&self, bound: Duration) -> Reader {
        let engine = self.clone();
        let pool = self.pool.clone();
        Reader {
            read: Box::new(move || {
                let engine = engine.clone();
                Box::pin(async move {
                    match tokio::time::timeout(bound, engine.read_fresh()).await {
                        Ok(Ok(now)) => Some(now),
                        Ok(Err(err)) => {
                            tracing::debug!(error = %err, "the shared fresh read failed");
                            None
                        }
                        Err(_) => None,
                    }
                })
            }),
            stop: Box::pin(async move { pool.close_event().await }),
        }
    }

    /// One read of the credentials' version and the database clock, on a claim connection.
    async fn read_fresh(&self) -> Result<Now, crate::IdemError> {
        let Some(kept) = self.claim_connections() else { return store::fresh(&self.pool).await };
        let mut lent = kept.lend().await?;
        let read = store::fresh(lent.connection()).await;
        // A connection the server ended is closed here; the requests waiting fall back to
        // reading their keys, which send again on another connection.
        lent.give_back(match &read {
            Err(crate::IdemError::Database(err)) => Some(err),
            _ => None,
        });
        read
    }
}
