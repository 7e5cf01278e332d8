//! `[idempotency]`: the engine's lease, retries, retention, its own connections, the replay
//! cache, and which road a payment's phases take.

use std::time::Duration;

use serde::Deserialize;

/// `[idempotency]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    /// Lease length after each claim or phase commit.
    pub lease_ms: u64,
    /// Retries of serialization failures and deadlocks.
    pub db_retries: u32,
    /// How long completed keys are kept at least.
    pub retention_hours: u32,
    /// Connections kept for the claim statement, beside the pool; 0: claims use the pool.
    pub claim_connections: u32,
    /// The longest a claim statement on those connections runs or waits for a row lock.
    pub claim_timeout_ms: u64,
    /// Connections kept for one-statement phases, beside the pool; 0: they use the pool.
    pub phase_connections: u32,
    /// Bytes of finished answers the API keeps in memory to answer replays from; 0: none.
    pub answer_memory_bytes: u64,
    /// Whether concurrent one-statement phases of one kind share a statement (`idem::batch`).
    pub batch_phases: bool,
    /// Whether a new payment's phases take the fast path (one statement each where they can, the
    /// claim in the first) or the reference road (a transaction each). Both write the same.
    pub fast_path: bool,
}

impl IdempotencySettings {
    /// The engine's tunables.
    pub fn engine_config(&self) -> idem::EngineConfig {
        idem::EngineConfig {
            lease: Duration::from_millis(self.lease_ms),
            db_retries: self.db_retries,
            claim_connections: self.claim_connections as usize,
            phase_connections: self.phase_connections as usize,
            claim_timeout: Duration::from_millis(self.claim_timeout_ms),
            answer_memory: usize::try_from(self.answer_memory_bytes).unwrap_or(usize::MAX),
            retention: Duration::from_secs(u64::from(self.retention_hours) * 3600),
            ..idem::EngineConfig::default()
        }
    }
}
