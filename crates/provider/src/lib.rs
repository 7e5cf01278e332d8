//! Everything that leaves our database goes through this crate.
//!
//! - [`client`]: a Stripe-compatible card-processor client (`POST /v1/charges`, capture, refunds,
//!   retrieve, search) whose errors are typed by what the caller may do ([`ErrorClass`]: final,
//!   transient, unknown outcome, reconcile), with bounded full-jitter retries that always reuse
//!   the same key, and money-moving requests frozen before their first attempt
//!   ([`FrozenRequest`]).
//! - [`keys`]: the downstream idempotency keys, derived from our own record ids.
//! - [`signature`]: Stripe's webhook signature scheme, to sign and to verify.
//! - [`types`]: the processor's objects and the requests we send, in Stripe's wire format.
//!
//! This crate knows nothing of SQL or of payments' state machine, and serves nothing: the
//! stand-in processor it talks to in tests and demos is the `processor-sim` crate.

pub mod client;
pub mod keys;
pub mod signature;
pub mod types;

pub use client::{
    CardProcessor, ErrorClass, ProcessorClient, ProcessorConfig, ProcessorError, ReconcileCause,
    TransientCause,
};
pub use keys::DownstreamKey;
pub use types::{Charge, ChargeOutcome, ChargeRequest, FrozenRequest, Refund, RefundRequest};
