//! The payments domain: accounts and API keys, payments, refunds, events and webhook endpoints,
//! and the operations that change them ([`operations`]), one file each.
//!
//! This crate knows nothing of HTTP servers. The API and the worker both call into it, so that a
//! request and a background completion run one and the same code.

pub mod accounts;
pub mod audit;
pub mod authentication;
pub mod deliveries;
pub mod events;
pub mod ids;
pub mod jobs;
pub mod money;
pub mod operations;
pub mod payments;
pub mod problems;
pub mod processor_events;
pub mod receipts;
pub mod refunds;
pub mod retention;
pub mod stored;
pub mod text;
pub mod webhooks;

pub use accounts::{Account, ApiKey, SecretKey};
pub use ids::{AccountId, ApiKeyId, EventId, PaymentId, RefundId, WebhookEndpointId};

/// Everything that can go wrong in the domain layer.
#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    /// The database failed; the caller decides whether that is transient.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// An input broke a rule; `param` names it as the public API spells it.
    #[error("{message}")]
    Invalid {
        /// The offending parameter.
        param: &'static str,
        /// What is wrong with it, for a person.
        message: String,
    },
    /// The object does not exist, or belongs to someone else.
    #[error("no such {0}")]
    NotFound(&'static str),
    /// A stored value does not have the shape this code writes.
    #[error("corrupt record: {0}")]
    Corrupt(&'static str),
    /// A signing secret does not open with the sealing keys (`webhooks.sealing_key`, old keys).
    #[error("a webhook endpoint's signing secret does not open: {0}")]
    Unsealable(#[from] webhooks::Unsealable),
}
