//! The HTTP side of the idempotency engine: what every money-moving handler goes through.
//!
//! `IdempotentPost` takes a money-moving POST apart in the contract's order; `RequiredKey` parses
//! the `Idempotency-Key` header (400 when missing or malformed). `Runner::run` fingerprints the
//! request and reads the key's claim, which either replays the stored answer (with
//! `Idempotent-Replayed: true`), refuses (409 with `Retry-After`, 422), or finds the key open to
//! this request; then, on a task of its own, it takes the key and runs the operation. axum drops a
//! handler's future when the client hangs up: the claim's read writes nothing, so it may be cut
//! off, but a takeover cut off after the database granted its lease would leave the key leased to
//! nobody until the lease expired, and an operation cut off halfway likewise. The task takes the
//! key, and finishes the phase it is in, whatever the client does; graceful shutdown waits for
//! it, and gives back at their recovery points the leases of tasks it cannot wait for. An
//! operation whose first phase claims its key (a new payment, on the fast path:
//! `Operation::claims_in_first_phase`) is answered on the request's task only from the answers
//! kept in memory; its claim, which may store the key with the phase's writes, runs on the task.

use axum::http::HeaderName;
use payments_domain::operations::PaymentOperation;
use provider::ProcessorClient;

/// An operation a handler starts: one the completer can resume, with the API's processor.
pub trait StartedOperation: PaymentOperation<ProcessorClient> + 'static {}

impl<O: PaymentOperation<ProcessorClient> + 'static> StartedOperation for O {}

/// The header a replayed answer carries.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The header that carries an API version, part of the fingerprint when present.
pub static PAYMENTS_VERSION: HeaderName = HeaderName::from_static("payments-version");

mod extract;
mod runner;

pub use extract::{IdempotentPost, Keyed, OptionalKey, RequestMeta, RequiredKey};
pub use runner::{Runner, stored_response};
