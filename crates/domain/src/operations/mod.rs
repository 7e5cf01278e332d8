//! The money-moving operations, as state machines of recovery points on the idempotency engine.
//!
//! Each operation is one `idem::Operation` in a module of its own, read top to bottom in the
//! order of its recovery points: [`create_payment`], [`capture`], [`cancel`], [`refund`]. What
//! capture and cancel share (both act on an authorization) is in `authorization`; the
//! reconciliation every operation shares in `reconcile`. A request runs an operation through the
//! API's runner, and the completer runs the very same code through [`resume`]; the
//! [`PaymentOperation`] trait ties the name stored with a key to the operation and its input, so
//! the two cannot disagree. Every foreign call sits between two phases. The phase before it
//! freezes the call (`Step::Call`): path, every field and the downstream key, derived from a
//! record that phase committed, are stored with the key, and every attempt, by any process and
//! any release, sends exactly that ([`provider::FrozenRequest`]).
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

use std::collections::BTreeMap;
use std::sync::Arc;

use idem::batch::Batcher;
use idem::{Interrupted, Lease, Operation, PhaseError, StoredResponse, TransientKind};
use provider::{CardProcessor, ProcessorError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::DomainError;
use crate::audit::{self, AuditEvent};
use crate::ids::{AccountId, PaymentId};
use crate::payments::{self, Payment};
use crate::problems::{PROBLEM_JSON, Problem, ProblemCode};
use crate::refunds::Refund;

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

mod authorization;
pub mod cancel;
pub mod capture;
pub mod create_endpoint;
pub mod create_payment;
mod reconcile;
pub mod refund;
pub mod update_endpoint;
pub mod update_payment;

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

/// An operation a key can name: its stored name tied to its input type, so that the handler that
/// starts it stores the name and the input of one and the same operation, and the completer
/// resumes that operation with that input. (A cancel's name with a capture's input does not
/// compile; after a crash, it would have resumed that capture as a cancel.) Every one is a
/// variant of [`StoredOperation`], which the completer resumes.
pub trait PaymentOperation<P>: Operation + Sized + Into<StoredOperation<P>> {
    /// The name stored with the key.
    const NAME: &'static str;
    /// The input stored with the key, for the completer.
    type Params: Serialize + DeserializeOwned;

    /// The operation for `params` (read back from the key, when the completer resumes it).
    fn with_params(ctx: &Context<P>, params: Self::Params) -> Self;

    /// Its input, as the key stores it.
    fn params(&self) -> &Self::Params;
}

/// What every operation needs.
pub struct Context<P> {
    /// The database.
    pub pool: PgPool,
    /// The card processor.
    pub processor: Arc<P>,
    /// The base of problem `type` links in stored answers.
    pub public_base_url: Arc<str>,
    /// Further `metadata[…]` members for every new charge (`processor.charge_metadata`).
    pub charge_metadata: Arc<BTreeMap<String, String>>,
    /// The batches the last phase of new payments share (`idem::batch`), or `None` to send each
    /// alone (`idempotency.batch_phases`).
    pub charged: Option<Batcher<payments::batch::Charged>>,
    /// Whether a new payment's phases take the fast path, one statement each where they can
    /// (`operations/create_payment/fast_path.rs`), or the reference road, a transaction each
    /// (`idempotency.fast_path`). Both write the same.
    pub fast_path: bool,
}

impl<P> Context<P> {
    /// A context with no further charge metadata, whose phases go in batches.
    pub fn new(pool: PgPool, processor: Arc<P>, public_base_url: Arc<str>) -> Self {
        let charged = Some(Batcher::new(pool.clone(), payments::batch::Charged));
        let charge_metadata = Arc::default();
        Self { pool, processor, public_base_url, charge_metadata, charged, fast_path: true }
    }

    /// The same, with a new payment's phases on the fast path or the reference road.
    pub fn with_fast_path(self, fast_path: bool) -> Self {
        Self { fast_path, ..self }
    }

    /// The same, with `metadata` sent with every new charge.
    pub fn with_charge_metadata(self, metadata: BTreeMap<String, String>) -> Self {
        Self { charge_metadata: Arc::new(metadata), ..self }
    }

    /// The same, with phases sent in batches or each alone.
    pub fn with_batches(self, batches: bool) -> Self {
        let charged = batches.then(|| Batcher::new(self.pool.clone(), payments::batch::Charged));
        Self { charged, ..self }
    }
}

impl<P> Clone for Context<P> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            processor: self.processor.clone(),
            public_base_url: self.public_base_url.clone(),
            charge_metadata: self.charge_metadata.clone(),
            charged: self.charged.clone(),
            fast_path: self.fast_path,
        }
    }
}

impl<P> std::fmt::Debug for Context<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("public_base_url", &self.public_base_url)
            .finish_non_exhaustive()
    }
}

impl From<DomainError> for PhaseError<DomainError> {
    fn from(err: DomainError) -> Self {
        match err {
            // Database errors go to the engine as such, so it can retry serialization failures.
            DomainError::Database(err) => PhaseError::Database(err),
            other => PhaseError::Operation(other),
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

/// A payment as a stored answer, with its ETag (and `Location` when it was created).
pub fn payment_answer(status: u16, payment: &Payment, created: bool) -> StoredResponse {
    let body = payment.to_json();
    let etag = Payment::etag_of(&body);
    let answer = StoredResponse::json(status, body).with_header("etag", etag);
    if created {
        answer.with_header("location", format!("/v1/payments/{}", payment.id))
    } else {
        answer
    }
}

fn refund_answer(refund: &Refund) -> StoredResponse {
    StoredResponse::json(201, refund.to_json())
        .with_header("location", format!("/v1/refunds/{}", refund.id))
}

/// A problem as a stored answer, its `instance` the first request's id.
pub(crate) fn problem_answer(
    problem: &Problem,
    request_id: &str,
    public_base_url: &str,
) -> StoredResponse {
    StoredResponse {
        status: problem.code.status(),
        headers: vec![("content-type".into(), PROBLEM_JSON.into())],
        body: problem.render(request_id, public_base_url),
    }
}

/// The final answer for a processor error that is final; `None` for one that is not.
fn final_problem(err: &ProcessorError, payment_id: &str) -> Option<Problem> {
    match err {
        ProcessorError::Declined { decline_code, message, .. } => Some(
            Problem::new(ProblemCode::CardDeclined, message.clone())
                .with_extension("decline_code", decline_code.clone())
                .with_extension("payment_id", payment_id.to_owned()),
        ),
        ProcessorError::Invalid { param, message, .. } => {
            let problem = Problem::new(
                ProblemCode::InvalidRequest,
                format!("The card processor refused the request: {message}"),
            );
            Some(match param.as_deref() {
                Some("source") => problem.with_param("payment_method"),
                Some(other) => problem.with_param(other),
                None => problem,
            })
        }
        ProcessorError::Unavailable { .. }
        | ProcessorError::UnknownOutcome { .. }
        | ProcessorError::MustReconcile { .. } => None,
    }
}

/// A final refusal by the processor: its error, and the problem stored as the answer.
#[derive(Debug)]
struct Refused {
    err: ProcessorError,
    problem: Problem,
}

/// A call's outcome as the last phase records it: what the call returned, or its final refusal;
/// a failure that is not final interrupts the step (the key stays at its recovery point).
fn final_outcome<T>(
    outcome: Result<T, ProcessorError>,
    payment_id: &str,
) -> Result<Result<T, Refused>, Interrupted> {
    match outcome {
        Ok(made) => Ok(Ok(made)),
        Err(err) => match final_problem(&err, payment_id) {
            Some(problem) => Ok(Err(Refused { err, problem })),
            None => Err(unavailable(&err)),
        },
    }
}

/// How a call's outcome was learnt, for the audit record of the phase that records it: the
/// downstream key it went out under, and what reconciliation (or the processor's webhook) found
/// when that answered for the call.
#[derive(Debug, Clone, Copy)]
struct Learnt<'a> {
    key: &'a provider::DownstreamKey,
    reconciled: Option<&'a Value>,
}

fn failure_code(err: &ProcessorError) -> String {
    match err {
        ProcessorError::Declined { decline_code, .. } => decline_code.clone(),
        ProcessorError::Invalid { code, .. } => {
            code.clone().unwrap_or_else(|| "processor_invalid_request".into())
        }
        ProcessorError::Unavailable { .. }
        | ProcessorError::UnknownOutcome { .. }
        | ProcessorError::MustReconcile { .. } => "processor_error".into(),
    }
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
/// for itself). `object` is the account, the object's id and the action.
async fn record_reconciled(
    tx: &mut PgConnection,
    (account_id, object_id, action): (&str, &str, &str),
    lease: &LeaseInfo,
    found: Option<&Value>,
) -> Result<(), DomainError> {
    let Some(detail) = found else { return Ok(()) };
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

/// Every operation a key can name, as mini-redis's `Command`: the handlers start one of these
/// (each operation converts into its variant), and the completer resumes it from its stored
/// name and input ([`StoredOperation::from_stored`]). Its kinds ([`OperationKind`], one per
/// variant, derived) are matched exhaustively both ways, so an operation a handler can start is
/// one the completer resumes, by construction.
#[derive(Debug, strum::EnumDiscriminants)]
#[strum_discriminants(name(OperationKind), derive(strum::EnumIter, Hash))]
#[strum_discriminants(doc = "The kind of a [`StoredOperation`], by its variant.")]
pub enum StoredOperation<P> {
    /// `POST /v1/payments`.
    CreatePayment(CreatePayment<P>),
    /// `POST /v1/payments/{id}/capture`.
    Capture(CapturePayment<P>),
    /// `POST /v1/payments/{id}/cancel`.
    Cancel(CancelPayment<P>),
    /// `POST /v1/payments/{id}/refunds`.
    Refund(CreateRefundOp<P>),
    /// `PATCH /v1/payments/{id}` with a key.
    UpdatePayment(UpdatePayment),
    /// `POST /v1/webhook_endpoints` with a key.
    CreateEndpoint(CreateEndpoint),
    /// `POST /v1/webhook_endpoints/{id}` with a key.
    UpdateEndpoint(UpdateEndpoint),
}

/// Why a key cannot be resumed by this code: it never will be by retrying.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unresumable(String);

impl<P: CardProcessor> StoredOperation<P> {
    /// The operation a key names, with its stored input.
    pub fn from_stored(ctx: &Context<P>, name: &str, params: Value) -> Result<Self, Unresumable> {
        fn of<P, O: PaymentOperation<P>>(
            ctx: &Context<P>,
            params: Value,
        ) -> Result<O, Unresumable> {
            serde_json::from_value(params)
                .map(|params| O::with_params(ctx, params))
                .map_err(|err| Unresumable(format!("stored parameters do not parse: {err}")))
        }
        let kind = OperationKind::of_name(name)
            .ok_or_else(|| Unresumable(format!("unknown operation `{name}`")))?;
        Ok(match kind {
            OperationKind::CreatePayment => Self::CreatePayment(of(ctx, params)?),
            OperationKind::Capture => Self::Capture(of(ctx, params)?),
            OperationKind::Cancel => Self::Cancel(of(ctx, params)?),
            OperationKind::Refund => Self::Refund(of(ctx, params)?),
            OperationKind::UpdatePayment => Self::UpdatePayment(of(ctx, params)?),
            OperationKind::CreateEndpoint => Self::CreateEndpoint(of(ctx, params)?),
            OperationKind::UpdateEndpoint => Self::UpdateEndpoint(of(ctx, params)?),
        })
    }

    /// The name stored with its key.
    pub fn name(&self) -> &'static str {
        OperationKind::from(self).name()
    }

    /// Drives it from the lease's recovery point to its answer.
    pub async fn drive(&mut self, lease: Lease) -> Result<StoredResponse, Interrupted> {
        match self {
            Self::CreatePayment(op) => idem::drive(op, lease).await,
            Self::Capture(op) => idem::drive(op, lease).await,
            Self::Cancel(op) => idem::drive(op, lease).await,
            Self::Refund(op) => idem::drive(op, lease).await,
            Self::UpdatePayment(op) => idem::drive(op, lease).await,
            Self::CreateEndpoint(op) => idem::drive(op, lease).await,
            Self::UpdateEndpoint(op) => idem::drive(op, lease).await,
        }
    }
}

macro_rules! into_stored {
    ($($variant:ident($operation:ty)),+ $(,)?) => {$(
        impl<P> From<$operation> for StoredOperation<P> {
            fn from(operation: $operation) -> Self {
                Self::$variant(operation)
            }
        }
    )+};
}

into_stored!(
    CreatePayment(CreatePayment<P>),
    Capture(CapturePayment<P>),
    Cancel(CancelPayment<P>),
    Refund(CreateRefundOp<P>),
    UpdatePayment(UpdatePayment),
    CreateEndpoint(CreateEndpoint),
    UpdateEndpoint(UpdateEndpoint),
);

impl OperationKind {
    /// The name a key of this kind stores: its operation's [`PaymentOperation::NAME`].
    pub fn name(self) -> &'static str {
        match self {
            Self::CreatePayment => CREATE_PAYMENT,
            Self::Capture => CAPTURE_PAYMENT,
            Self::Cancel => CANCEL_PAYMENT,
            Self::Refund => CREATE_REFUND,
            Self::UpdatePayment => UPDATE_PAYMENT,
            Self::CreateEndpoint => CREATE_ENDPOINT,
            Self::UpdateEndpoint => UPDATE_ENDPOINT,
        }
    }

    /// The kind whose name this is.
    pub fn of_name(name: &str) -> Option<Self> {
        <Self as strum::IntoEnumIterator>::iter().find(|kind| kind.name() == name)
    }
}

/// The names the completer resumes: every [`StoredOperation`]'s.
pub fn resumable() -> Vec<&'static str> {
    <OperationKind as strum::IntoEnumIterator>::iter().map(OperationKind::name).collect()
}

/// Resumes any operation from its key, as the completer does: the one whose name is stored with
/// the key, with its stored input. A key this code cannot resume (an unknown operation, an input
/// that does not parse) never will be by retrying: it is flagged for a person, not left leased.
pub async fn resume<P: CardProcessor>(
    ctx: &Context<P>,
    lease: Lease,
) -> Result<StoredResponse, Interrupted> {
    match StoredOperation::from_stored(ctx, lease.operation(), lease.params().clone()) {
        Ok(mut operation) => operation.drive(lease).await,
        Err(Unresumable(reason)) => {
            lease.flag(&reason).await;
            Err(Interrupted::NeedsHuman { reason })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use provider::ProcessorClient;

    use super::*;

    /// The kind whose name the operation `O` stores.
    fn kind_of<O: PaymentOperation<ProcessorClient>>() -> Option<OperationKind> {
        OperationKind::of_name(O::NAME)
    }

    #[test]
    fn every_kind_has_its_own_name_and_resumes_under_it() {
        let names = resumable();
        let distinct: BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "two operations share a name: {names:?}");
        for name in names {
            assert_eq!(OperationKind::of_name(name).map(OperationKind::name), Some(name));
        }
        assert_eq!(OperationKind::of_name("payments.refund"), None);
    }

    #[test]
    fn each_operation_stores_the_name_of_its_own_kind() {
        // A key stored by a capture must resume as a capture: two names swapped between kinds
        // would resume one operation as the other.
        use OperationKind as Kind;
        assert_eq!(kind_of::<CreatePayment<ProcessorClient>>(), Some(Kind::CreatePayment));
        assert_eq!(kind_of::<CapturePayment<ProcessorClient>>(), Some(Kind::Capture));
        assert_eq!(kind_of::<CancelPayment<ProcessorClient>>(), Some(Kind::Cancel));
        assert_eq!(kind_of::<CreateRefundOp<ProcessorClient>>(), Some(Kind::Refund));
        assert_eq!(kind_of::<UpdatePayment>(), Some(Kind::UpdatePayment));
        assert_eq!(kind_of::<CreateEndpoint>(), Some(Kind::CreateEndpoint));
        assert_eq!(kind_of::<UpdateEndpoint>(), Some(Kind::UpdateEndpoint));
    }

    #[test]
    fn the_stored_names_do_not_change() {
        // Keys in flight name their operation so: a renamed operation would leave them
        // unresumable after a deploy.
        assert_eq!(
            resumable(),
            [
                "payments.create",
                "payments.capture",
                "payments.cancel",
                "refunds.create",
                "payments.update",
                "webhook_endpoints.create",
                "webhook_endpoints.update",
            ]
        );
    }
}
