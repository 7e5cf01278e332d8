//! A failed processor call ([`ProcessorError`]) and what the caller may do about it
//! ([`ErrorClass`]), with the causes that say why a failure is transient or must be reconciled.

/// What the caller may do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The processor decided (a decline, an invalid request): never retry; it is the answer.
    Final,
    /// The processor did not act, or failed: retry later with the same key.
    Transient,
    /// The request may or may not have been acted on: retry later with the same key, which makes
    /// the processor return what it did, if it did anything.
    UnknownOutcome,
    /// The processor will not tell us, under this key, what the first request with it did (it
    /// refuses our retry as different, or replays a failure it stored for the key): no retry
    /// with the key can help. Look the object up by our own id instead (reconcile).
    Reconcile,
}

/// Why an answer leaves the first request's outcome to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileCause {
    /// `400 idempotency_error`: the key was first used with other parameters (an earlier release
    /// built the request differently, or someone else used the key).
    KeyReused,
    /// A 5xx replayed for the key (`Idempotent-Replayed: true`): the processor stored a failure
    /// of the first request, which may have acted before it failed, and will answer it for ever.
    ReplayedFailure(u16),
    /// A 2xx whose body this client cannot read: the processor acted, and a retry could make a
    /// server that ignores idempotency keys act again, so the call is never sent again for it.
    /// Look the object up; what it shows is what the call did.
    UnreadableAnswer,
}

/// Why a transient failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransientCause {
    /// Could not connect: the request never left.
    Connect,
    /// A 5xx answer.
    ServerError(u16),
    /// 429.
    RateLimited,
    /// 409: a request with the same key is in progress there.
    Conflict,
    /// 401/403: our processor key is wrong. Not the customer's fault, so not a final answer to
    /// store; the key stays resumable until an operator fixes the configuration.
    Authentication,
}

/// A failed processor call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessorError {
    /// The card was declined (402). Final.
    #[error("card declined ({decline_code})")]
    Declined {
        /// Why, e.g. `insufficient_funds`.
        decline_code: String,
        /// For people.
        message: String,
        /// The failed charge, when the processor made one.
        charge_id: Option<String>,
        /// The PaymentIntent the decline left in `requires_payment_method`, when the error
        /// carries one (Stripe sends it whole inside the 402; only its id is kept).
        payment_intent: Option<String>,
    },
    /// The processor refused the request as invalid (400, 404, other 4xx). Final.
    #[error("invalid request to the processor ({status}): {message}")]
    Invalid {
        /// The HTTP status.
        status: u16,
        /// Stripe's error code, e.g. `resource_missing`, `idempotency_error`.
        code: Option<String>,
        /// The offending parameter.
        param: Option<String>,
        /// For people.
        message: String,
    },
    /// The processor was unavailable or failed. Transient.
    #[error("processor unavailable: {message}")]
    Unavailable {
        /// Why.
        cause: TransientCause,
        /// For logs.
        message: String,
    },
    /// The request may have been acted on; we cannot know. Retry with the same key.
    #[error("processor outcome unknown: {message}")]
    UnknownOutcome {
        /// For logs.
        message: String,
    },
    /// The key can no longer tell us what the first request with it did. Never a final answer:
    /// look the object up.
    #[error("processor outcome must be reconciled ({cause:?}): {message}")]
    MustReconcile {
        /// Which answer said so.
        cause: ReconcileCause,
        /// For logs.
        message: String,
    },
}

impl ProcessorError {
    /// What the caller may do about it.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Declined { .. } | Self::Invalid { .. } => ErrorClass::Final,
            Self::Unavailable { .. } => ErrorClass::Transient,
            Self::UnknownOutcome { .. } => ErrorClass::UnknownOutcome,
            Self::MustReconcile { .. } => ErrorClass::Reconcile,
        }
    }
}
