//! Stored responses: what a key answers forever once its operation reached a final outcome.

use serde::{Deserialize, Serialize};

/// A final answer: status, the headers that matter, and the body bytes exactly as first sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The HTTP status.
    pub status: u16,
    /// Headers replayed with it (`Content-Type`, `Location`, `ETag`), names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A response with a JSON body.
    pub fn json(status: u16, body: Vec<u8>) -> Self {
        Self { status, headers: vec![("content-type".into(), "application/json".into())], body }
    }

    /// Adds a header, replacing one of the same name.
    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Self {
        let name = name.to_ascii_lowercase();
        self.headers.retain(|(existing, _)| *existing != name);
        self.headers.push((name, value.into()));
        self
    }

    /// The value of a header, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(existing, _)| existing.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}
