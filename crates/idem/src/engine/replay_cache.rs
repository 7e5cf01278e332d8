//! Finished answers kept in memory, so that a replay costs the database a share of one small
//! statement instead of a read of its key.
//!
//! A finished key's answer never changes: the key keeps it until the reaper deletes the key, a
//! retention window after it was finished. Any process may therefore keep a copy, keyed by
//! account and idempotency key, and answer a replay (or a mismatch: the first request's
//! fingerprint, method and path never change either) from it. What can change is whether the
//! request may have it: its API key may have been revoked, and the key may have outlived its
//! retention and been deleted, after which a reuse is a new request. Both are decided exactly as a
//! read of the database would decide them at the moment the request arrived:
//!
//! - **Revocation.** Every change to the API keys that could end a key's life replaces one number,
//!   the credentials' version, in the same transaction (the domain's trigger; drawn at random, so
//!   that no two changes share one; the engine reads it through the hook `idem_credentials`). The claim's read returns the version with its check of the credential,
//!   from the same snapshot: a credential found live at version `v` is live for as long as the
//!   version is still `v`.
//! - **Retention.** The reaper deletes a key once `completed_at < now() - retention` by the
//!   database clock; the copy keeps `completed_at` and is used only while the database clock
//!   says the key is inside its window (with the engine's `retention`, which must be the
//!   reaper's: the API's and the worker's `idempotency.retention_hours` are one setting, and a
//!   shorter retention is rolled out to the API before the worker).
//!
//! Both need the version and the database clock *as of a moment after the request arrived*. A
//! request does not read them itself: it waits for the next read of them that begins after it
//! arrived ([`Fresh`]), and all the requests that arrived meanwhile share that read. Under load,
//! one statement answers many replays; alone, a replay costs one statement as before, a smaller
//! one. Without a copy, or without a check of its credential here, a request reads its key at
//! once, as it would have without the copies; when the shared read says the copy cannot answer (a
//! changed version, a copy past its window) or fails or keeps the request waiting 250 ms, the
//! request reads its key after it, and that replay costs two statements.
//!
//! The copies are bounded in bytes, in two generations: a full current generation becomes the
//! previous one, and the previous one is dropped; a copy found in the previous generation moves
//! back to the current one. Copies are made from replays read from the database, not from the
//! answers this process stores, so that keys which are never retried take no memory.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::Engine;
use crate::fingerprint::Fingerprint;
use crate::response::StoredResponse;
use crate::store;

/// A finished key's answer, as a replay read it (borrowed: it is packed, not kept as is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer<'a> {
    pub fingerprint: Fingerprint,
    pub method: &'a str,
    pub path: &'a str,
    pub response: &'a StoredResponse,
    /// When the key was finished, in microseconds since the Unix epoch by the database clock.
    pub completed_at_us: i64,
}

/// An answer as kept: its body and texts back to back in one block. Thousands of copies then
/// make a few thousand blocks the size of a response rather than a dozen small pieces each,
/// which the allocator would scatter among the short-lived allocations of the requests running
/// meanwhile, and keep pages for long after the copies are dropped.
struct Packed {
    fingerprint: Fingerprint,
    completed_at_us: i64,
    status: u16,
    /// The body, each header's name and value, the method and the path.
    bytes: Box<[u8]>,
    /// Where each of those ends in `bytes`.
    ends: Box<[u32]>,
}

impl Packed {
    /// `None` for an answer too large to describe with 32-bit offsets (never kept).
    fn of(answer: Answer<'_>) -> Option<Self> {
        let response = answer.response;
        let pieces = std::iter::once(response.body.as_slice())
            .chain(response.headers.iter().flat_map(|(n, v)| [n.as_bytes(), v.as_bytes()]))
            .chain([answer.method.as_bytes(), answer.path.as_bytes()]);
        let (mut bytes, mut ends) = (Vec::new(), Vec::new());
        for piece in pieces {
            bytes.extend_from_slice(piece);
            ends.push(u32::try_from(bytes.len()).ok()?);
        }
        Some(Self {
            fingerprint: answer.fingerprint,
            completed_at_us: answer.completed_at_us,
            status: response.status,
            bytes: bytes.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
        })
    }

    /// The pieces `of` put in, in order; `None` if the offsets do not describe `bytes` (which
    /// `of` never makes: a copy that cannot be read answers nothing, and the key is read).
    fn pieces(&self) -> Option<Vec<&[u8]>> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let piece = self.bytes.get(start as usize..end as usize)?;
                start = end;
                Some(piece)
            })
            .collect()
    }

    fn text(piece: &[u8]) -> Option<String> {
        String::from_utf8(piece.to_vec()).ok()
    }

    fn response(&self) -> Option<StoredResponse> {
        let pieces = self.pieces()?;
        let [body, headers @ .., _method, _path] = pieces.as_slice() else { return None };
        let headers = headers
            .chunks(2)
            .map(|pair| match pair {
                [name, value] => Some((Self::text(name)?, Self::text(value)?)),
                _ => None,
            })
            .collect::<Option<_>>()?;
        Some(StoredResponse { status: self.status, headers, body: body.to_vec() })
    }

    /// The first request's method and path.
    fn request_line(&self) -> Option<(String, String)> {
        let pieces = self.pieces()?;
        let [_body, .., method, path] = pieces.as_slice() else { return None };
        Some((Self::text(method)?, Self::text(path)?))
    }

    /// What the copy costs, roughly: its bytes and the maps' overhead.
    fn size(&self, name: &str) -> usize {
        name.len() + self.bytes.len() + self.ends.len() * 4 + 160
    }
}

/// The answers kept, the credentials confirmed live, and the shared fresh read.
pub(crate) struct ReplayCache {
    /// Bytes the copies may take; 0 keeps none.
    budget: usize,
    /// How long after its completion a copy may answer: the retention, less a margin
    /// ([`window_us`]).
    window_us: i64,
    kept: Mutex<Generations>,
    /// Credential digest → the account it is a live key of, and the version it was found live at.
    credentials: Mutex<HashMap<Vec<u8>, (String, Uuid)>>,
    fresh: Fresh,
}

#[derive(Default)]
struct Generations {
    current: HashMap<String, Arc<Packed>>,
    current_bytes: usize,
    previous: HashMap<String, Arc<Packed>>,
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache").field("budget", &self.budget).finish_non_exhaustive()
    }
}

/// Credentials confirmed live that are remembered at most; beyond, the map starts again empty.
const CREDENTIALS: usize = 10_000;

/// The longest a replay waits for the shared read before it reads its key instead: a database
/// slow enough to make it wait longer is better served by the read the request would have made
/// without the copy than by a wait and then that read.
const FRESH_WAIT: Duration = Duration::from_millis(250);

/// The retention window in microseconds, as the reaper counts it (whole milliseconds), less a
/// tenth of it and at most a minute: the reaper deletes by the clock of the database it writes
/// to, which after a failover is another server's, and a copy used a little less long costs only
/// a read of the key near the end of its window.
fn window_us(retention: Duration) -> i64 {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let margin_ms = (retention_ms / 10).min(60_000);
    (retention_ms - margin_ms).saturating_mul(1000)
}

/// The name of a key's copy: its account and its key, which no account id can run into (an
/// account id has no NUL).
fn name(account_id: &str, key: &str) -> String {
    let mut name = String::with_capacity(account_id.len() + 1 + key.len());
    name.push_str(account_id);
    name.push('\0');
    name.push_str(key);
    name
}

impl ReplayCache {
    pub(crate) fn new(budget: usize, retention: Duration) -> Self {
        Self {
            budget,
            window_us: window_us(retention),
            kept: Mutex::default(),
            credentials: Mutex::default(),
            fresh: Fresh::default(),
        }
    }

    fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The copy of a key's answer, if one is kept.
    fn get(&self, name: &str) -> Option<Arc<Packed>> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(answer) = kept.current.get(name) {
            return Some(answer.clone());
        }
        let answer = kept.previous.remove(name)?;
        kept.insert(name.to_owned(), answer.clone(), self.budget);
        Some(answer)
    }

    /// Whether a key finished at `completed_at_us` may be answered from memory at `now_us`, both
    /// by the database clock.
    fn inside_window(&self, completed_at_us: i64, now_us: i64) -> bool {
        now_us < completed_at_us.saturating_add(self.window_us)
    }

    /// Keeps a copy of a finished key's answer, read at `now_us` by the database clock (one past
    /// the end of its shortened window is not kept: it could answer nothing).
    pub(crate) fn keep(&self, account_id: &str, key: &str, answer: Answer<'_>, now_us: i64) {
        if !self.enabled() || !self.inside_window(answer.completed_at_us, now_us) {
            return;
        }
        let Some(answer) = Packed::of(answer) else { return };
        let name = name(account_id, key);
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.insert(name, Arc::new(answer), self.budget);
    }

    fn forget(&self, name: &str) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(answer) = kept.current.remove(name) {
            kept.current_bytes = kept.current_bytes.saturating_sub(answer.size(name));
        }
        kept.previous.remove(name);
    }

    /// Records what a claim's read found of a credential it checked: live at `version` for
    /// `account_id`, or not (`None`).
    pub(crate) fn credential_seen(&self, digest: &[u8], live: Option<(&str, Uuid)>) {
        if !self.enabled() {
            return;
        }
        let mut credentials = self.credentials.lock().unwrap_or_else(PoisonError::into_inner);
        match live {
            Some((account_id, version)) => {
                if credentials.len() >= CREDENTIALS && !credentials.contains_key(digest) {
                    credentials.clear();
                }
                credentials.insert(digest.to_vec(), (account_id.to_owned(), version));
            }
            None => {
                credentials.remove(digest);
            }
        }
    }

    /// The version at which `digest` was found a live key of `account_id`, if it was.
    fn confirmed(&self, digest: &[u8], account_id: &str) -> Option<Uuid> {
        let credentials = self.credentials.lock().unwrap_or_else(PoisonError::into_inner);
        let (account, version) = credentials.get(digest)?;
        (account == account_id).then_some(*version)
    }

    /// The kept answer to a request, decided as its key's read would decide it now: `None` when
    /// the request must read its key.
    pub(crate) async fn answer(
        &self,
        engine: &Engine,
        account_id: &str,
        credential: Option<&[u8]>,
        key: &str,
        fingerprint: &Fingerprint,
    ) -> Option<CachedAnswer> {
        // A closed pool fails the request's own read at once; the shared read would not come.
        if !self.enabled() || engine.pool.is_closed() {
            return None;
        }
        let name = name(account_id, key);
        let answer = self.get(&name)?;
        // A credential the caller has not checked must have been found live by a read whose
        // version is still the current one; `None` means the caller checked it itself.
        let confirmed = match credential {
            Some(digest) => Some(self.confirmed(digest, account_id)?),
            None => None,
        };
        let bound = engine.config.claim_timeout.min(FRESH_WAIT);
        let (version, now_us) = self.fresh.after_now(|| engine.fresh_reader(bound), bound).await?;
        if confirmed.is_some_and(|confirmed| confirmed != version) {
            return None;
        }
        if !self.inside_window(answer.completed_at_us, now_us) {
            // The reaper may delete the key at any moment, if it has not.
            self.forget(&name);
            return None;
        }
        Some(if answer.fingerprint == *fingerprint {
            CachedAnswer::Replay(answer.response()?)
        } else {
            let (method, path) = answer.request_line()?;
            CachedAnswer::Mismatch { method, path }
        })
    }
}

impl Generations {
    fn insert(&mut self, name: String, answer: Arc<Packed>, budget: usize) {
        let size = answer.size(&name);
        if size > budget / 2 {
            return;
        }
        // The same key kept twice (two replays read it at once) counts once.
        if let Some(replaced) = self.current.remove(&name) {
            self.current_bytes = self.current_bytes.saturating_sub(replaced.size(&name));
        }
        if self.current_bytes + size > budget / 2 {
            self.previous = std::mem::take(&mut self.current);
            self.current_bytes = 0;
        }
        self.current_bytes += size;
        self.current.insert(name, answer);
    }
}

/// What a kept answer says.
#[derive(Debug)]
pub(crate) enum CachedAnswer {
    Replay(StoredResponse),
    Mismatch { method: String, path: String },
}

/// The shared read of the credentials' version and the database clock.
///
/// Reads are numbered as they begin. A request notes how many had begun when it asked
/// (`started`), so the first read that can serve it is the next one; it wakes the reader and
/// waits for that read's result. The reader runs one read at a time, back to back while anyone
/// waits: every request that arrived while a read was running shares the next one.
#[derive(Default)]
struct Fresh {
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
type Now = (Uuid, i64);

/// The result of the read numbered `read`: `None` when it failed.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    read: u64,
    fresh: Option<Now>,
}

/// What the reader's task runs: `read` for each read (the version and the clock, `None` when the
/// read failed), until `stop` completes (the engine's pool closed).
struct Reader {
    read: Box<dyn Fn() -> BoxFuture<'static, Option<Now>> + Send + Sync>,
    stop: BoxFuture<'static, ()>,
}

impl Fresh {
    /// The credentials' version and the database clock, read after this call began; `None` when
    /// that read failed or did not come within `bound`. The first call starts the reader's task
    /// with `reader` (an engine that never replays, the worker's, never starts one).
    async fn after_now(&self, reader: impl FnOnce() -> Reader, bound: Duration) -> Option<Now> {
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
    fn fresh_reader(&self, bound: Duration) -> Reader {
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

#[cfg(test)]
mod tests {
    use tokio::sync::{mpsc, oneshot};

    use super::*;

    /// A reader whose reads each wait for the test to give them a version.
    fn reader(begun: mpsc::UnboundedSender<oneshot::Sender<u128>>) -> impl FnOnce() -> Reader {
        move || Reader {
            read: Box::new(move || {
                let begun = begun.clone();
                Box::pin(async move {
                    let (answer, version) = oneshot::channel();
                    let _ = begun.send(answer);
                    version.await.ok().map(|v| (Uuid::from_u128(v), 0))
                })
            }),
            stop: Box::pin(std::future::pending()),
        }
    }

    fn unused() -> Reader {
        unreachable!("the reader is started by the first request")
    }

    #[tokio::test]
    async fn a_read_that_began_before_a_request_does_not_serve_it_and_the_next_is_shared() {
        let (begun_tx, mut begun) = mpsc::unbounded_channel();
        let fresh = Arc::new(Fresh::default());
        let bound = Duration::from_secs(10);
        let first = tokio::spawn({
            let fresh = fresh.clone();
            async move { fresh.after_now(reader(begun_tx), bound).await }
        });
        let read_1 = begun.recv().await.unwrap();
        // Two requests arrive while the first read runs: it may have read before they arrived.
        let later: Vec<_> = (0..2)
            .map(|_| {
                let fresh = fresh.clone();
                tokio::spawn(async move { fresh.after_now(unused, bound).await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        read_1.send(1).unwrap();
        assert_eq!(first.await.unwrap(), Some((Uuid::from_u128(1), 0)));
        // One more read serves both.
        let read_2 = begun.recv().await.unwrap();
        read_2.send(2).unwrap();
        for request in later {
            assert_eq!(request.await.unwrap(), Some((Uuid::from_u128(2), 0)));
        }
        tokio::task::yield_now().await;
        assert!(begun.try_recv().is_err(), "a third read began with nobody waiting");
    }

    #[tokio::test]
    async fn a_read_that_failed_or_never_came_serves_nothing() {
        let (begun_tx, mut begun) = mpsc::unbounded_channel();
        let fresh = Arc::new(Fresh::default());
        let waiting = tokio::spawn({
            let fresh = fresh.clone();
            async move { fresh.after_now(reader(begun_tx), Duration::from_secs(10)).await }
        });
        drop(begun.recv().await.unwrap()); // the read fails
        assert_eq!(waiting.await.unwrap(), None);
        let timed_out = fresh.after_now(unused, Duration::from_millis(50)).await;
        assert_eq!(timed_out, None);
    }

    fn answer(response: &StoredResponse) -> Answer<'_> {
        Answer {
            fingerprint: Fingerprint::from_bytes(&[0; 32]).expect("32 bytes"),
            method: "POST",
            path: "/v1/payments",
            response,
            completed_at_us: 0,
        }
    }

    #[test]
    fn a_packed_answer_gives_back_what_it_was_made_of() {
        let response = StoredResponse::json(200, b"xxx".to_vec())
            .with_header("location", "/v1/payments/pay_1");
        let line = Some(("POST".to_owned(), "/v1/payments".to_owned()));
        let packed = Packed::of(answer(&response)).expect("a small answer packs");
        assert_eq!(packed.response().as_ref(), Some(&response));
        assert_eq!(packed.request_line(), line);
        let bare = StoredResponse { status: 204, headers: vec![], body: vec![] };
        let packed = Packed::of(answer(&bare)).expect("an empty answer packs");
        assert_eq!(packed.response().as_ref(), Some(&bare));
        assert_eq!(packed.request_line(), line);
        // Offsets that do not describe the bytes read as nothing, never as an empty answer.
        let broken = Packed { ends: vec![1, 99, 100].into_boxed_slice(), ..packed };
        assert_eq!(broken.response(), None);
        assert_eq!(broken.request_line(), None);
    }

    #[test]
    fn the_copies_stay_within_their_budget_and_a_copy_used_lately_stays() {
        let answers = ReplayCache::new(64 << 10, Duration::from_secs(3600));
        let response = StoredResponse::json(200, vec![b'x'; 1000]);
        answers.keep("acct_1", "used", answer(&response), 0);
        for n in 0..1000 {
            answers.keep("acct_1", &n.to_string(), answer(&response), 0);
            assert!(answers.get(&name("acct_1", "used")).is_some(), "after {n}");
        }
        let kept = answers.kept.lock().unwrap();
        let bytes: usize =
            kept.current.iter().chain(&kept.previous).map(|(name, answer)| answer.size(name)).sum();
        assert!(bytes <= 64 << 10, "{bytes} bytes kept");
        assert!(!kept.current.contains_key(&name("acct_1", "0")), "the oldest copies go");
        assert!(kept.current.len() + kept.previous.len() >= 30, "most of the budget is used");
    }
}
