//! The card-processor client: Stripe's wire format over reqwest, with every error typed by what
//! the caller may do about it, and bounded retries that always reuse the same downstream key.
//! Every request carries the configured `Stripe-Version`; a 2xx whose body cannot be read is
//! never sent again (it is [`ReconcileCause::UnreadableAnswer`]: look the object up).
//!
//! Here: what we need of a processor ([`CardProcessor`]): PaymentIntents (create and confirm,
//! capture, cancel, retrieve, search) and their refunds. How it is reached is in `config`; its errors and their classes in `error`; the HTTP
//! client, its retries and its metrics in `http`; how an answer becomes an error in `answer`;
//! each call's path and the paged lookups in `endpoints`.

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

use crate::types::{FrozenRequest, PaymentIntent, Refund};

/// The operations we need from a card processor. The HTTP client implements it; tests may use a
/// deterministic double. The money-moving calls take a [`FrozenRequest`]: what is sent was
/// decided, and stored, before the first attempt.
pub trait CardProcessor: Send + Sync + 'static {
    /// Refunds a captured payment ([`crate::RefundRequest`]): `POST /v1/refunds`.
    fn create_refund(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<Refund, ProcessorError>> + Send;

    /// Creates and confirms a PaymentIntent ([`crate::PaymentIntentRequest`]):
    /// `POST /v1/payment_intents`. A decline answers [`ProcessorError::Declined`] with the
    /// intent's id; a card that needs authentication answers the intent in `requires_action`.
    fn create_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<PaymentIntent, ProcessorError>> + Send;

    /// Captures an authorized PaymentIntent ([`FrozenRequest::capture_intent`]):
    /// `POST /v1/payment_intents/{id}/capture`.
    fn capture_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<PaymentIntent, ProcessorError>> + Send;

    /// Cancels a PaymentIntent, releasing its authorization ([`FrozenRequest::cancel_intent`]):
    /// `POST /v1/payment_intents/{id}/cancel`.
    fn cancel_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> impl Future<Output = Result<PaymentIntent, ProcessorError>> + Send;

    /// Reads a PaymentIntent: `GET /v1/payment_intents/{id}`.
    fn retrieve_payment_intent(
        &self,
        intent_id: &str,
    ) -> impl Future<Output = Result<PaymentIntent, ProcessorError>> + Send;

    /// The PaymentIntents whose `metadata[payment_id]` is `payment_id`, through the processor's
    /// search (`GET /v1/payment_intents/search`), which may trail writes by up to
    /// [`CardProcessor::search_lag`].
    fn search_payment_intents(
        &self,
        payment_id: &str,
    ) -> impl Future<Output = Result<Vec<PaymentIntent>, ProcessorError>> + Send;

    /// Every refund of a PaymentIntent (`GET /v1/refunds?payment_intent=…`; a consistent list,
    /// no lag).
    fn list_intent_refunds(
        &self,
        intent_id: &str,
    ) -> impl Future<Output = Result<Vec<Refund>, ProcessorError>> + Send;

    /// The longest a call may take, retries included (for the lease check).
    fn longest_call(&self) -> Duration;

    /// How far the processor's search may trail its writes.
    fn search_lag(&self) -> Duration;
}
