//! A typed async client for the payments API that retries safely.
//!
//! Half of idempotency is the client. Every money-moving call here is one *operation* with one
//! `Idempotency-Key` (a fresh UUIDv4 unless the caller gives one), and every retry of that
//! operation sends the same key, so the server runs it at most once and answers every retry with
//! the original result.
//!
//! - Network errors, timeouts, `409` (the first request is still running), `429` and `5xx` are
//!   retried with full-jitter exponential back-off, never sooner than `Retry-After` says, up to a
//!   bound; the error that ends the retries carries the key, so the caller can ask again later.
//! - Any other answer is final: a replayed answer (`Idempotent-Replayed: true`) is as final as a
//!   fresh one, and problem `code`s become typed errors.
//!
//! ```no_run
//! # async fn example() -> Result<(), payments_client::Error> {
//! use payments_client::{Client, NewPayment};
//!
//! let client = Client::new("http://127.0.0.1:8080", "sk_test_…")?;
//! let payment = client.create_payment(&NewPayment::new(500, "usd", "pm_card_visa"), None).await?;
//! println!("{} ({}), key {}", payment.value.id, payment.value.status, payment.key);
//! # Ok(()) }
//! ```
//!
//! Here: what the crate offers. The calls are in `client`, how a client is made (its timeouts:
//! every request has one) in `builder`, when and how long it waits before trying again in
//! `retry`, the API's objects in `resources`, what a call can end in in `error`.

mod builder;
mod client;
mod error;
mod resources;
mod retry;
pub mod webhooks;

pub use builder::{ClientBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
pub use client::{Client, Idempotent};
pub use error::{Code, Error, Problem};
pub use resources::{List, NewPayment, NextAction, Payment, PaymentStatus, RedirectToUrl, Refund};
pub use retry::RetryPolicy;

#[cfg(test)]
mod tests;
