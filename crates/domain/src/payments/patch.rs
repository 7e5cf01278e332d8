//! A JSON Merge Patch (RFC 7386) of a payment's `description` and `metadata`, applied in the
//! caller's transaction: `PATCH /v1/payments/{id}` without an `Idempotency-Key` applies it
//! directly ([`apply`]); with one, it is the one phase of the operation
//! [`UpdatePayment`](crate::operations::UpdatePayment), so that a retry replays the first answer
//! instead of applying the patch again (a merge patch retried after someone else's change would
//! otherwise undo that change).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::DomainError;
use crate::events::{self, EventType};
use crate::ids::{AccountId, PaymentId};
use crate::payments::{self, Changes, Payment};
use crate::problems::{Problem, ProblemCode};

// Also the patch as a key stores it: a member absent stays absent, and a `null` stays `null`.
// (Not a doc comment: the doc is the OpenAPI document's description.)
/// The body of `PATCH /v1/payments/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentPatch {
    /// `null` removes it.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub description: Option<Option<String>>,
    /// Members with `null` are removed; the whole `null` removes all.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Option<BTreeMap<String, Option<String>>>>,
}

/// Tells a member that is absent (`None`) from one that is `null` (`Some(None)`).
fn present<'de, T, D>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl PaymentPatch {
    /// The rules that need no payment: each value the patch sets, each key it names. (How many
    /// pairs the merged metadata holds is known only against the payment.)
    pub fn validate(&self) -> Result<(), DomainError> {
        if let Some(Some(description)) = &self.description {
            payments::validate_description(Some(description))?;
        }
        if let Some(Some(changes)) = &self.metadata {
            for (key, value) in changes {
                payments::validate_metadata_entry(key, value.as_deref())?;
            }
        }
        Ok(())
    }
}

/// What applying a patch came to.
#[derive(Debug)]
pub enum Patched {
    /// The payment as it now is.
    Updated(Box<Payment>),
    /// No such payment in the account.
    Missing,
    /// `If-Match` named none of the payment's current ETag; nothing changed.
    Stale {
        /// The ETag the payment has.
        current_etag: String,
    },
}

/// Locks the payment, checks `If-Match`, merges the patch and writes it, in the caller's
/// transaction. The merged metadata is checked here (at most 50 pairs).
pub async fn apply(
    tx: &mut PgConnection,
    account_id: &AccountId,
    id: &PaymentId,
    patch: &PaymentPatch,
    if_match: Option<&str>,
) -> Result<Patched, DomainError> {
    let Some(payment) = payments::lock(tx, account_id, id).await? else {
        return Ok(Patched::Missing);
    };
    if let Some(expected) = if_match {
        let current = Payment::etag_of(&payment.to_json());
        let matches = expected.split(',').map(str::trim).any(|tag| tag == "*" || tag == current);
        if !matches {
            return Ok(Patched::Stale { current_etag: current });
        }
    }
    let metadata = match &patch.metadata {
        None => None,
        Some(None) => Some(BTreeMap::new()),
        Some(Some(changes)) => {
            let mut merged = payment.metadata.clone();
            for (key, value) in changes {
                match value {
                    Some(value) => merged.insert(key.clone(), value.clone()),
                    None => merged.remove(key),
                };
            }
            payments::validate_metadata(&merged)?;
            Some(merged)
        }
    };
    let changes = Changes {
        description: patch.description.as_ref().map(|d| d.as_deref()),
        metadata: metadata.as_ref(),
        ..Changes::default()
    };
    let payment = payments::update(tx, id, &changes, None).await?;
    events::record(tx, account_id, EventType::PaymentUpdated, &payment.to_json()).await?;
    Ok(Patched::Updated(Box::new(payment)))
}

/// The problem a stale `If-Match` answers.
pub fn stale_problem(current_etag: &str) -> Problem {
    Problem::new(
        ProblemCode::PreconditionFailed,
        format!("The payment changed: its ETag is now {current_etag}. Read it again and retry."),
    )
}

/// The problem an unknown payment answers.
pub fn missing_problem(id: &str) -> Problem {
    Problem::new(ProblemCode::ResourceMissing, format!("No such payment: '{id}'.")).with_param("id")
}
