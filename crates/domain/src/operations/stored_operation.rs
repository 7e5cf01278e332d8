//! Every operation a key can name, and how the completer resumes one from its key: one enum,
//! [`StoredOperation`], as mini-redis's `Command`, with a kind per variant matched exhaustively
//! from the name a key stores and back.

use idem::{Interrupted, Lease, Operation, StoredResponse};
use provider::CardProcessor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{
    CANCEL_PAYMENT, CAPTURE_PAYMENT, CREATE_ENDPOINT, CREATE_PAYMENT, CREATE_REFUND, CancelPayment,
    CapturePayment, Context, CreateEndpoint, CreatePayment, CreateRefundOp, UPDATE_ENDPOINT,
    UPDATE_PAYMENT, UpdateEndpoint, UpdatePayment,
};

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

/// Every operation a key can name, as mini-redis's `Command`: the handlers start one of these
/// (each operation converts into its variant), and the completer resumes it from its stored
/// name and input ([`StoredOperation::from_stored`]). Its kinds ([`OperationKind`], one per
/// variant, derived) are matched exhaustively both ways, so an operation a handler can start is
/// one the completer resumes, by construction.
#[derive(Debug, strum::EnumDiscriminants)]
#[allow(clippy::large_enum_variant)] // one per request or completer run, driven at once; a box would only allocate
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
