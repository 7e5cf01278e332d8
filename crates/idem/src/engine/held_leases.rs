//! The leases a process holds, so that a process that stops gives back those it cannot finish
//! (`release_held`) instead of leaving their keys leased until the lease runs out.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::Duration;

use uuid::Uuid;

use super::Engine;
use super::give_back::{GiveBack, Holding};
use crate::error::PhaseError;

/// The leases a process holds (key id, token), and whether it still takes new ones.
#[derive(Default)]
pub(super) struct Held {
    leases: HashMap<i64, Uuid>,
    /// Set by `release_held`: a lease the database grants after it is given back at once, so
    /// that a claim already on its way when the shutdown gave up cannot leave its key leased to
    /// a process about to exit.
    closed: bool,
    /// How many leases are on their way from the database right now (a new key's first phase or
    /// `store_new`, a claim's takeover, the completer's `take_due`), which `release_held` waits
    /// for: the database may grant such a lease after the release looked, and an `UPDATE`
    /// cannot release a row another transaction has not committed yet.
    granting: usize,
}

/// A lease on its way from the database, counted until it is recorded as held (or given back);
/// `release_held` waits until none is.
pub(crate) struct Granting(Engine);

impl Drop for Granting {
    fn drop(&mut self) {
        let mut held = self.0.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.granting = held.granting.saturating_sub(1);
    }
}

impl Engine {
    /// Gives back, at their recovery points, every lease this process still holds, for a
    /// shutdown that cannot wait for them: their keys can be resumed at once (a retry, another
    /// process's completer) instead of after the lease. A holder still running loses its next
    /// fenced commit. Returns how many were released.
    pub async fn release_held(&self, reason: &str) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
        // No lease starts on its way from now on. Those already on their way are recorded as
        // held once their commit is acknowledged, or give themselves back (`Lease::stored`,
        // `hold_granted`); wait for them, a bounded while, since the process exits when this
        // returns. A takeover's statement waits at most `claim_timeout` for the key's row; as
        // long again covers its connection, its `BEGIN` and its commit. One that takes longer
        // still gives its lease back when it is granted, if the process is still there.
        let deadline = tokio::time::Instant::now() + 2 * self.config.claim_timeout;
        while self.held.lock().unwrap_or_else(PoisonError::into_inner).granting > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let held: Vec<(i64, Uuid)> = {
            let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.leases.iter().map(|(key_id, token)| (*key_id, *token)).collect()
        };
        let mut released = 0;
        for (key_id, token) in held {
            if self.release_now(key_id, token, reason).await {
                released += 1;
            }
        }
        released
    }

    /// Releases one lease at its recovery point, now ([`Engine::give_back`]). False if it was no
    /// longer ours or the database could not be reached.
    pub(super) async fn release_now(&self, key_id: i64, token: Uuid, reason: &str) -> bool {
        let holding = Holding::Stored { key_id };
        let back = GiveBack { holding, token, reason: reason.to_owned(), retry_in: Duration::ZERO };
        self.give_back(back, false).await == Some(true)
    }

    /// Records a lease this process holds. After `release_held` it is not recorded, and false is
    /// returned: the caller must give it back (if the database granted it) and not use it.
    pub(super) fn hold(&self, key_id: i64, token: Uuid) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.closed {
            return false;
        }
        held.leases.insert(key_id, token);
        true
    }

    /// Records a lease the database just granted, or, when the process is stopping, gives it
    /// back at once and answers false.
    pub(super) async fn hold_granted(&self, key_id: i64, token: Uuid) -> bool {
        if self.hold(key_id, token) {
            return true;
        }
        self.release_now(key_id, token, "the server was stopping when the lease was granted").await;
        false
    }

    /// Counts a lease on its way from the database, or `None` once `release_held` ran: a process
    /// that is stopping takes no new lease.
    pub(super) fn granting(&self) -> Option<Granting> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.closed {
            return None;
        }
        held.granting += 1;
        Some(Granting(self.clone()))
    }

    /// For a phase that may store a new key (`new`): its count while it runs, or, once the
    /// process is stopping, a lost lease (nothing was written; a retry runs it elsewhere).
    pub(super) fn granting_new<E>(&self, new: bool) -> Result<Option<Granting>, PhaseError<E>> {
        if !new {
            return Ok(None);
        }
        self.granting().map(Some).ok_or(PhaseError::LeaseLost)
    }

    /// Whether `release_held` ran: the process is stopping.
    pub(super) fn is_closed(&self) -> bool {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).closed
    }

    pub(super) fn forget(&self, key_id: i64, token: Uuid) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.leases.get(&key_id) == Some(&token) {
            held.leases.remove(&key_id);
        }
    }
}
