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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use uuid::Uuid;

use super::Engine;
use crate::fingerprint::Fingerprint;
use crate::response::StoredResponse;

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

mod fresh;
#[cfg(test)]
mod tests;

use fresh::Fresh;
#[cfg(test)]
use fresh::Reader;
