//! The completer's claim: keys nobody finished (their holder crashed, or gave them back after a
//! transient failure), taken one at a time when their next attempt is due, so that the worker
//! drives them to their end with the very code a request runs (`worker/src/completer.rs`).

use std::time::Duration;

use super::Engine;
use super::lease::Lease;
use crate::error::IdemError;
use crate::observe::Event;
use crate::store;

impl Engine {
    /// The completer's claim: up to `limit` unfinished keys whose lease is free or expired and
    /// whose next attempt is due, each leased to this process. The completer asks for one key at
    /// a time and drives it before asking again: a key leased while it waits behind others can
    /// see its lease run out before its turn comes. A key the completer has already run
    /// `max_attempts` times, or created longer than `window` ago, is flagged for a person
    /// instead (returned as `Due::Flagged`) and never retried automatically. Only the
    /// completer's own runs count against `max_attempts`: a client may retry a key (resume or
    /// take it over) as often as it likes without spending the completer's budget.
    ///
    /// Only keys of the `operations` the caller can drive are taken: during a rolling deploy, a
    /// completer of the older release leaves a key of an operation only the newer one knows to a
    /// completer that knows it, rather than taking it and finding nothing to do but flag it. A
    /// key of an operation no release knows any more is flagged by the reaper once it is older
    /// than the retention ([`Engine::reap`]).
    pub async fn take_due(
        &self,
        limit: u32,
        max_attempts: u32,
        window: Duration,
        operations: &[&str],
    ) -> Result<Vec<Due>, IdemError> {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let lease_ms = self.config.lease_ms();
        // As a claim's takeover: counted until every lease is recorded as held (or given back).
        let Some(_granting) = self.granting() else { return Ok(Vec::new()) };
        let rows = self
            .retrying(|| async {
                Ok(store::take_due(&self.pool, i64::from(limit), lease_ms, window_ms, operations)
                    .await?)
            })
            .await?;
        let mut due = Vec::with_capacity(rows.len());
        for row in rows {
            let reason = if row.too_old {
                Some("older than the processor's idempotency window".to_owned())
            } else if u32::try_from(row.completer_attempts).unwrap_or(u32::MAX) > max_attempts {
                Some(format!("the completer gave up after {max_attempts} attempts"))
            } else {
                None
            };
            if let Some(reason) = reason {
                // A failure here must not drop the batch: the leases taken with this key would
                // be neither driven nor given back until they expire.
                let flagged = self
                    .retrying(|| async {
                        Ok(store::flag(&self.pool, row.id, row.token, &reason).await?)
                    })
                    .await;
                match flagged {
                    Ok(true) => {}
                    // The lease ran out between the take and the flag, and another taker holds
                    // the key now: it is theirs to drive, not a person's.
                    Ok(false) => {
                        tracing::info!(
                            key_id = row.id,
                            reason,
                            "a key due for a person was taken by another request first"
                        );
                        continue;
                    }
                    Err(err) => {
                        tracing::warn!(
                            key_id = row.id,
                            error = %err,
                            "could not flag a key for a person; it is taken again when its lease expires"
                        );
                        continue;
                    }
                }
                self.observer.event(Event::Flagged);
                tracing::error!(
                    key_id = row.id,
                    recovery_point = %row.recovery_point,
                    attempts = row.attempts,
                    completer_attempts = row.completer_attempts,
                    reason,
                    "an idempotency key needs a person"
                );
                due.push(Due::Flagged { key_id: row.id, reason });
                continue;
            }
            self.observer.event(Event::TookOver);
            if !self.hold_granted(row.id, row.token).await {
                continue;
            }
            due.push(Due::Lease(Lease {
                engine: self.clone(),
                key_id: row.id,
                token: row.token,
                point: row.recovery_point,
                attempts: row.attempts,
                operation: row.operation,
                params: row.request_params,
                request_id: row.request_id,
                finished: None,
                just_planned: None,
                new: None,
            }));
        }
        Ok(due)
    }
}

/// What the completer found.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one at a time, matched at once; a box would only allocate
pub enum Due {
    /// A key to drive to its end.
    Lease(Lease),
    /// A key flagged for a person instead.
    Flagged {
        /// The key's row id.
        key_id: i64,
        /// Why.
        reason: String,
    },
}
