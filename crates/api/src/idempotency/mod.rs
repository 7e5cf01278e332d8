//! The HTTP side of the idempotency engine: what every money-moving handler goes through.
//!
//! `IdempotentPost` takes a money-moving POST apart in the contract's order; `RequiredKey` parses
//! the `Idempotency-Key` header (400 when missing or malformed). `Runner::run` fingerprints the
//! request and answers a replay kept in memory at once (with `Idempotent-Replayed: true`); else,
//! on a task of its own, it claims the key, which replays the stored answer, refuses (409 with
//! `Retry-After`, 422), or grants the lease, and runs the operation. axum drops a handler's future
//! when the client hangs up: a claim cut off after the database granted its lease would leave the
//! key leased to nobody until the lease expired, and an operation cut off halfway likewise. The
//! task claims the key, and finishes the phase it is in, whatever the client does; graceful
//! shutdown waits for it, and gives back at their recovery points the leases of tasks it cannot
//! wait for. How the key is claimed is the operation's (`Operation::claim`): a read, or, for a new
//! payment on the fast path, its first phase, which stores the key with the phase's writes.

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
