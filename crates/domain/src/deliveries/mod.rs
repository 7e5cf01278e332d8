//! Webhook deliveries as a queue shared by every account: claimed fairly, under caps, and each
//! endpoint's health, so that one account's failing endpoints cannot hold back another's.
//!
//! - [`claim`]: the due deliveries of the endpoints that may be tried now, at most
//!   [`Caps::per_endpoint`] running per endpoint and [`Caps::per_account`] per account, counted
//!   across every worker; among accounts, round-robin: each account's oldest due delivery first,
//!   the account whose oldest has waited longest first, then each one's second, and so on.
//! - [`drop_undeliverable`]: the due deliveries of endpoints disabled or deleted since their event
//!   are done without a send, in bulk.
//! - [`health`]: an endpoint that keeps failing is paused (its deliveries deferred, then one
//!   tried as a probe), then disabled with the event `webhook_endpoint.disabled`.
//!
//! The deliveries are rows of `jobs` (kind `webhook`, `endpoint_id` read from the payload); their
//! `done` and `failed` are the jobs' own ([`crate::jobs`]).

mod claim;
pub mod health;

pub use claim::{Caps, claim, drop_undeliverable};
pub use health::{FailureRecorded, HealthRules};
