//! Hooks for metrics: the engine reports what it decided, and the application counts it.

/// Something the engine did that operators want to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A new key was claimed.
    Claimed,
    /// A released key was resumed from its recovery point.
    Resumed,
    /// A key whose holder's lease had expired was taken over.
    TookOver,
    /// A stored response was replayed.
    Replayed,
    /// A replay or a mismatch was answered from the answers kept in memory, without reading its
    /// key (counted besides `Replayed` or `Mismatch`).
    AnsweredFromMemory,
    /// A request found the key held by another (409).
    InUse,
    /// A request's fingerprint differed from the key's (422).
    Mismatch,
    /// A phase commit was refused by the fence.
    LeaseLost,
    /// A key was released after a transient failure.
    Released,
    /// A final response was stored.
    Finished,
    /// A key was flagged for a person.
    Flagged,
    /// A statement or phase was retried after a serialization failure or deadlock.
    DatabaseRetry,
}

/// Receives the engine's events. The default does nothing.
pub trait Observer: Send + Sync + 'static {
    /// Called once per event, on the task that caused it; must not block.
    fn event(&self, event: Event) {
        let _ = event;
    }
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {}
