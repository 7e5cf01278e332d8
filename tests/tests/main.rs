//! The end-to-end tests, one module per area, linked into one test binary (`--test e2e`)
//! instead of one per file. Run one area with a filter: `cargo test -p payments-tests --test e2e
//! -- proof::`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

mod auth;
mod authentication;
mod client;
mod edge;
mod edge_holds;
mod edge_sources;
mod examples;
mod failover;
mod fairness;
mod fast_path;
mod free_text;
mod inspector;
mod leases;
mod lists;
mod operations;
mod payments;
mod processor_faults;
mod processor_webhooks;
mod proof;
mod round_trips;
mod secrets;
mod sparse_processor;
mod webhook_fairness;
mod webhook_log;
mod webhooks;
