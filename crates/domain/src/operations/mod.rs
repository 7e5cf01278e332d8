//! The money-moving operations, as state machines of recovery points on the idempotency engine.
//!
//! Each operation is one `idem::Operation` in a file of its own, read top to bottom in the order
//! of its recovery points: [`create_payment`], [`capture`], [`cancel`], [`refund`], and the three
//! of one phase that call no processor, [`update_payment`], [`create_endpoint`],
//! [`update_endpoint`]. Each phase is plain functions over a fenced transaction (`lease.begin()`
//! … `tx.commit_…`). What capture and cancel share (both act on an authorization) is in
//! `authorization`; the reconciliation every operation shares in `reconcile`; what a call's
//! outcome comes to in `outcomes`; the stored answers in `answers`. A request runs an operation
//! through the API's runner, and the completer runs the very same code through [`resume`]
//! ([`StoredOperation`], in `stored_operation`, ties the name stored with a key to the operation
//! and its input, so the two cannot disagree). Every foreign call sits between two phases. The
//! phase before it freezes the call (`tx.commit_call`): path, every field and the downstream key,
//! derived from a record that phase committed, are stored with the key, and every attempt, by any
//! process, sends exactly that ([`provider::FrozenRequest`]).
//!
//! | operation | recovery points | downstream key |
//! |---|---|---|
//! | create a payment | `started` → `payment_created` → finished | `pay_…/charge` |
//! | capture | `started` → `capture_started` → finished | `pay_…/capture/k<key id>` |
//! | cancel | `started` → `cancel_started` → finished | `pay_…/cancel/k<key id>` |
//! | refund | `started` → `refund_created` → finished | `re_…/refund` |
//!
//! The call's result and the final answer are committed in one phase, and a new key is stored by
//! the first phase with its writes, so a new payment costs two commits: the insert (with the key),
//! and the result with the stored answer. The claim before them is a read.
//!
//! When the processor cannot tell us what a call did (it refuses our retry as different, or
//! replays a failure it stored for the key), the operation reconciles: it looks the object up by
//! our id, adopts what it finds, moves to the key's next generation when a trustworthy lookup
//! finds nothing, and flags the key for a person otherwise. Never a guess, never a stored answer
//! built from such a reply.
//!
//! The processor also pushes what it did (its webhooks, [`crate::processor_events`]): a resumed
//! charge, or one whose call got no answer, first asks whether an event reported the charge its
//! downstream key made, and adopts it in its own fenced phase without calling or searching.

use idem::{IdemError, Interrupted, Lease, PhaseError, TransientKind};
use provider::ProcessorError;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::DomainError;
use crate::audit::{self, AuditEvent, Subject};
use crate::ids::{AccountId, PaymentId};
use crate::payments::{self, Payment};

macro_rules! recovery_points {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        /// The recovery points of one operation.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $( #[doc = $text] $variant ),+ }

        impl idem::RecoveryPoint for $name {
            fn name(self) -> &'static str {
                match self { $( Self::$variant => $text ),+ }
            }
            fn from_name(name: &str) -> Option<Self> {
                match name { $( $text => Some(Self::$variant), )+ _ => None }
            }
        }
    };
}

/// Declares a money-moving operation over a [`Context`]: its struct, `new`, and the
/// [`PaymentOperation`] that stores it as `$name` with its input `$params`.
macro_rules! payment_operation {
    ($(#[$doc:meta])* $operation:ident($params:ty) = $name:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $operation<P> {
            ctx: $crate::operations::Context<P>,
            params: $params,
        }

        impl<P: provider::CardProcessor> $operation<P> {
            /// The operation for validated input.
            pub fn new(ctx: $crate::operations::Context<P>, params: $params) -> Self {
                Self { ctx, params }
            }
        }

        impl<P: provider::CardProcessor> $crate::operations::PaymentOperation<P> for $operation<P> {
            const NAME: &'static str = $name;
            type Params = $params;

            fn with_params(ctx: &$crate::operations::Context<P>, params: $params) -> Self {
                Self::new(ctx.clone(), params)
            }

            fn params(&self) -> &$params {
                &self.params
            }
        }
    };
}

/// Declares an operation of one phase that calls no processor (a keyed PATCH, an endpoint's
/// creation or update): its struct (the base of problem links in its stored answers, and its
/// input), `new`, and its [`PaymentOperation`] under any processor.
macro_rules! one_phase_operation {
    ($(#[$doc:meta])* $operation:ident($params:ty) = $name:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $operation {
            public_base_url: std::sync::Arc<str>,
            params: $params,
        }

        impl $operation {
            /// The operation for input checked before the claim.
            pub fn new(public_base_url: std::sync::Arc<str>, params: $params) -> Self {
                Self { public_base_url, params }
            }
        }

        impl<P> $crate::operations::PaymentOperation<P> for $operation {
            const NAME: &'static str = $name;
            type Params = $params;

            fn with_params(ctx: &$crate::operations::Context<P>, params: $params) -> Self {
                Self::new(ctx.public_base_url.clone(), params)
            }

            fn params(&self) -> &$params {
                &self.params
            }
        }
    };
}

mod answers;
mod authorization;
pub mod cancel;
pub mod capture;
mod context;
pub mod create_endpoint;
pub mod create_payment;
mod outcomes;
mod reconcile;
pub mod refund;
mod stored_operation;
pub mod update_endpoint;
pub mod update_payment;

pub use answers::payment_answer;
pub(crate) use answers::problem_answer;
use answers::refund_answer;
pub use context::Context;
use outcomes::{Learnt, Refused, failure_code, final_outcome, final_problem};
pub use stored_operation::{
    OperationKind, PaymentOperation, StoredOperation, Unresumable, resumable, resume,
};

pub use cancel::{CANCEL_PAYMENT, CancelParams, CancelPayment, CancelPoint, CancellationReason};
pub use capture::{CAPTURE_PAYMENT, CaptureParams, CapturePayment, CapturePoint};
pub use create_endpoint::{
    CREATE_ENDPOINT, CreateEndpoint, CreateEndpointParams, CreateEndpointPoint,
};
pub use create_payment::{CREATE_PAYMENT, CreatePayment, CreatePaymentParams, CreatePoint};
pub use refund::{CREATE_REFUND, CreateRefundOp, RefundParams, RefundPoint};
pub use update_endpoint::{
    UPDATE_ENDPOINT, UpdateEndpoint, UpdateEndpointParams, UpdateEndpointPoint,
};
pub use update_payment::{UPDATE_PAYMENT, UpdateParams, UpdatePayment, UpdatePaymentPoint};

impl From<DomainError> for PhaseError<DomainError> {
    fn from(err: DomainError) -> Self {
        match err {
            // Database errors go to the engine as such, so it can retry serialization failures.
            DomainError::Database(err) => PhaseError::Database(err),
            other => PhaseError::Operation(other),
        }
    }
}

/// A domain error in a claim's first phase (`Engine::claim_first`): a database error as the
/// engine classifies it, a record of the wrong shape as a corrupt one.
impl From<DomainError> for IdemError {
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::Database(err) => IdemError::Database(err),
            DomainError::Corrupt(what) => IdemError::Corrupt(what),
            other => IdemError::Database(sqlx::Error::Protocol(other.to_string())),
        }
    }
}

/// A domain error in a step: a database error as the engine classifies it (a conflict runs the
/// step again), anything else an internal failure (the key stays at its recovery point).
impl From<DomainError> for Interrupted {
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::Database(err) => Interrupted::from(err),
            other => internal(other),
        }
    }
}

fn internal(err: impl std::fmt::Display) -> Interrupted {
    Interrupted::Transient { kind: TransientKind::Internal, detail: err.to_string() }
}

/// A processor failure that is not an answer: the key stays at its recovery point.
fn unavailable(err: &ProcessorError) -> Interrupted {
    Interrupted::Transient { kind: TransientKind::Processor, detail: err.to_string() }
}

async fn record(
    tx: &mut PgConnection,
    account_id: &str,
    object_id: &str,
    action: &str,
    lease: &LeaseInfo,
    detail: Value,
) -> Result<(), DomainError> {
    audit::record(tx, &lease.audit(account_id, object_id, action, detail)).await
}

/// Records, in the phase that acts on it, what reconciliation found (`None`: the call answered
/// for itself).
async fn record_reconciled(
    tx: &mut PgConnection,
    subject: Subject<'_>,
    lease: &LeaseInfo,
    found: Option<&Value>,
) -> Result<(), DomainError> {
    let Some(detail) = found else { return Ok(()) };
    let Subject { account_id, object_id, action } = subject;
    record(tx, account_id, object_id, action, lease, detail.clone()).await
}

/// What a phase needs to know of its lease, taken before the phase borrows the lease.
#[derive(Debug, Clone)]
struct LeaseInfo {
    key_id: i64,
    request_id: String,
}

impl LeaseInfo {
    fn of(lease: &Lease) -> Self {
        Self { key_id: lease.key_id(), request_id: lease.request_id().to_owned() }
    }

    /// The audit record of `action` on `object_id`, made under this lease.
    fn audit<'a>(
        &'a self,
        account_id: &'a str,
        object_id: &'a str,
        action: &'a str,
        detail: Value,
    ) -> AuditEvent<'a> {
        AuditEvent {
            account_id,
            object_id,
            action,
            request_id: &self.request_id,
            idempotency_key_id: self.key_id,
            detail,
        }
    }
}

async fn current_payment(
    pool: &PgPool,
    account_id: &AccountId,
    payment_id: &PaymentId,
) -> Result<Payment, Interrupted> {
    payments::find(pool, account_id, payment_id)
        .await
        .map_err(internal)?
        .ok_or_else(|| internal("the payment vanished"))
}
