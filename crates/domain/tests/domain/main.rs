//! The domain against a real Postgres, in one test binary: the record of a waiting payment's
//! outcome (`authentication`), the event list a poller walks (`events`), the rules the database keeps whoever writes (`schema`), the typed reads of what
//! is stored (`stored`), and the bound on webhook endpoints (`webhooks`). What they share is in
//! `support`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

mod support;

mod authentication;
mod events;
mod schema;
mod stored;
mod webhooks;
