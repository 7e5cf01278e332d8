//! Everything that leaves our database goes through this crate.
//!
//! - [`client`]: a Stripe-compatible card-processor client (PaymentIntents: create and confirm,
//!   capture, cancel, retrieve, search; their refunds) whose errors are typed by what the caller
//!   may do ([`ErrorClass`]: final, transient, unknown outcome, reconcile), with bounded
//!   full-jitter retries that always reuse the same key, money-moving requests frozen before
//!   their first attempt ([`FrozenRequest`]), and a pinned `Stripe-Version` on every request.
//! - [`keys`]: the downstream idempotency keys, derived from our own record ids.
//! - [`signature`]: Stripe's webhook signature scheme, to sign and to verify.
//! - [`types`]: the processor's objects (PaymentIntents, refunds, and the charges that its
//!   `charge.*` webhook events carry) and the requests we send, in Stripe's wire format; the
//!   objects are read leniently (unknown fields ignored, omitted ones defaulted), so that only a
//!   field the code uses can make an answer unreadable.
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
pub use types::{
    Charge, ChargeOutcome, FrozenRequest, IntentStatus, NextAction, PaymentError, PaymentIntent,
    PaymentIntentRequest, RedirectToUrl, Refund, RefundRequest,
};
