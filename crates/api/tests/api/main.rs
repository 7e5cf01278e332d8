//! The API crate's tests, in one test binary: the `payments-api` binary as an operator and a
//! script use it (`cli`), and the HTTP side of the idempotency engine through a real server
//! (`idempotency`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

mod cli;
mod idempotency;
