//! The engine against a real Postgres: every claim outcome, resumption from every recovery point,
//! takeovers, fencing, races, rollbacks, dropped futures and retried serialization failures.
//!
//! One test binary, one module per subject; what they share (the sample operation `PlaceOrder`
//! and the `Harness` that drives it) is in `helpers`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

mod helpers;

mod claims;
mod completer;
mod connections;
mod first_statement;
mod held_leases;
mod one_statement;
mod phases;
mod properties;
mod replay_cache;
