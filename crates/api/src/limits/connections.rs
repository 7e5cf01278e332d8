//! Open connections per source (`http.max_connections_per_source`), beside the bound on all of
//! them (`http.max_connections`): without it one host holding idle keep-alive connections, on
//! `/healthz` say, takes every place and the others wait in the listen backlog. A source is what
//! the per-address limits count ([`SourceKey`]: an IPv4 address, an IPv6 /64) of the TCP peer; a
//! trusted proxy, which carries many clients' connections, is not held to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::SourceKey;

/// The connections open from each source, at most `max` each. Holds an entry only for a source
/// with a connection open, so it is bounded by `http.max_connections`.
#[derive(Debug)]
pub struct SourceConnections {
    open: Arc<Mutex<HashMap<SourceKey, u32>>>,
    max: u32,
}

impl SourceConnections {
    /// At most `max` connections from each source.
    pub fn new(max: u32) -> Self {
        Self { open: Arc::default(), max }
    }

    /// A place for one more connection from `source`, held until the place is dropped; `None`
    /// when the source holds `max` already.
    pub fn open(&self, source: SourceKey) -> Option<SourceConnection> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(source).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(SourceConnection { open: self.open.clone(), source })
    }
}

/// One connection's place among its source's; given back when dropped.
#[derive(Debug)]
pub struct SourceConnection {
    open: Arc<Mutex<HashMap<SourceKey, u32>>>,
    source: SourceKey,
}

impl Drop for SourceConnection {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.source) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic in a test is a failed test
mod tests {
    use super::*;

    fn source(address: &str) -> SourceKey {
        SourceKey::of(address.parse().unwrap())
    }

    #[test]
    fn a_source_holds_at_most_its_places_and_gets_them_back_as_connections_end() {
        let connections = SourceConnections::new(2);
        let first = connections.open(source("2001:db8::1")).unwrap();
        let _second = connections.open(source("2001:db8::2")).unwrap();
        assert!(connections.open(source("2001:db8::3")).is_none(), "the same /64");
        assert!(connections.open(source("2001:db8:0:1::1")).is_some(), "another /64");
        drop(first);
        assert!(connections.open(source("2001:db8::3")).is_some());
    }

    #[test]
    fn a_source_with_nothing_open_is_forgotten() {
        let connections = SourceConnections::new(2);
        let places: Vec<_> =
            (0..10).filter_map(|i| connections.open(source(&format!("192.0.2.{i}")))).collect();
        assert_eq!(connections.open.lock().unwrap().len(), 10);
        drop(places);
        assert!(connections.open.lock().unwrap().is_empty());
    }
}
