//! The card-processor client: Stripe's wire format over reqwest, with every error typed by what
//! the caller may do about it, and bounded retries that always reuse the same downstream key.
//!
//! Here: what we need of a processor ([`CardProcessor`]). How it is reached is in `config`; its
//! errors and their classes in `error`; the HTTP client, its retries and its metrics in `http`;
//! how an answer becomes an error in `answer`; each call's path and the paged lookups in
//! `endpoints`.

mod answer;
mod config;
mod endpoints;
mod error;
mod http;

pub use config::ProcessorConfig;
pub use error::{ErrorClass, ProcessorError, ReconcileCause, TransientCause};
pub use http::ProcessorClient;

use std::future::Future;
use std::time::Duration;

use crate::types::{Charge, FrozenRequest, Refund};

/// The operations we need from a card processor. The HTTP client implements it; tests may use a
/// deterministic double. The money-moving calls take a [`FrozenRequest`]: what is sent was
/// decided, and stored, before the first attempt.
pub trait CardProcessor: Send + Sync + 'static {
    /// Creates (and, with `capture`, captures) a charge: `POST /v1/charges`.
    fn create_charge(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// Captures an authorized charge: `POST /v1/charges/{id}/capture`.
    fn capture_charge(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// Refunds a captured charge, or releases an uncaptured one: `POST /v1/refunds`.
    fn create_refund(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<Refund, ProcessorError>> + Send;

    /// Reads a charge.
    fn retrieve_charge(
        &self,
        charge_id: &str,
    ) -> impl Future<Output = Result<Charge, ProcessorError>> + Send;

    /// The charges whose `metadata[payment_id]` is `payment_id`, through the processor's search,
    /// which may trail writes by up to [`CardProcessor::search_lag`].
    fn search_charges(
        &self,
        payment_id: &str,
    ) -> impl Future<Output = Result<Vec<Charge>, ProcessorError>> + Send;

    /// Every refund of a charge (a consistent list, no lag).
    fn list_refunds(
        &self,
        charge_id: &str,
    ) -> impl Future<Output = Result<Vec<Refund>, ProcessorError>> + Send;

    /// The longest a call may take, retries included (for the lease check).
    fn longest_call(&self) -> Duration;

    /// How far the processor's search may trail its writes.
    fn search_lag(&self) -> Duration;
}
