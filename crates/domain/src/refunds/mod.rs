//! Refunds: the validated request, the stored row and its public representation; the SQL is in
//! `store` (the one module that reads and writes the `refunds` table).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::DomainError;
use crate::ids::{AccountId, PaymentId, RefundId};
use crate::money::{AMOUNT_MAX, Amount, Currency};
use crate::payments::validate_metadata;
use crate::stored::text_enum;

text_enum! {
    /// Why a refund was made.
    #[derive(utoipa::ToSchema)]
    pub enum RefundReason {
        /// A duplicate charge.
        Duplicate,
        /// Fraud.
        Fraudulent,
        /// The customer asked.
        RequestedByCustomer,
    }
}

text_enum! {
    /// Where a refund is.
    pub enum RefundStatus {
        /// Reserved against the payment; the processor has not answered yet.
        Pending,
        /// The money moved back.
        Succeeded,
        /// The processor refused it; the reservation was given back.
        Failed,
    }
}

/// `POST /v1/payments/{id}/refunds`, as the client sends it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRefundRequest {
    /// Default: what remains refundable.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 99_999_999)]
    pub amount: Option<i64>,
    /// Why.
    #[serde(default)]
    pub reason: Option<RefundReason>,
    /// String pairs.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

impl CreateRefundRequest {
    /// The rules that need no payment to check, and what they parsed.
    pub fn validate(&self) -> Result<NewRefund, DomainError> {
        let amount = self
            .amount
            .map(|amount| {
                Amount::new(amount).ok_or_else(|| DomainError::Invalid {
                    param: "amount",
                    message: format!("`amount` must be an integer from 1 to {AMOUNT_MAX}."),
                })
            })
            .transpose()?;
        if let Some(metadata) = &self.metadata {
            validate_metadata(metadata)?;
        }
        Ok(NewRefund {
            amount,
            reason: self.reason,
            metadata: self.metadata.clone().unwrap_or_default(),
        })
    }
}

/// A refund to make: the request as [`CreateRefundRequest::validate`] parsed it, and as the key
/// stores it for the completer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewRefund {
    /// Default: what remains refundable.
    pub amount: Option<Amount>,
    /// Why.
    pub reason: Option<RefundReason>,
    /// String pairs (none when the request had none).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A refund as the API shows it (the OpenAPI document's `Refund` is derived from this).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Refund)]
pub struct Representation<'a> {
    /// `re_…`
    #[schema(value_type = String, pattern = "^re_")]
    id: &'a RefundId,
    /// Always `refund`.
    #[schema(pattern = "^refund$")]
    object: &'static str,
    /// The refunded payment, `pay_…`.
    #[schema(value_type = String)]
    payment: &'a PaymentId,
    /// In the currency's minor unit.
    #[schema(value_type = i64)]
    amount: Amount,
    #[schema(value_type = String)]
    currency: Currency,
    /// `pending`, `succeeded` or `failed`.
    #[schema(value_type = String)]
    status: RefundStatus,
    #[schema(value_type = Option<String>)]
    reason: Option<RefundReason>,
    #[schema(value_type = BTreeMap<String, String>)]
    metadata: &'a BTreeMap<String, String>,
    /// The processor's refund, `re_…`.
    processor_refund_id: Option<&'a str>,
    /// Unix seconds.
    created: i64,
}

/// A refund as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Refund {
    /// `re_…`
    pub id: RefundId,
    /// The owner.
    pub account_id: AccountId,
    /// The refunded payment.
    pub payment_id: PaymentId,
    /// Minor units.
    pub amount: Amount,
    /// The payment's currency.
    pub currency: Currency,
    /// Where it is.
    pub status: RefundStatus,
    /// Why.
    pub reason: Option<RefundReason>,
    /// String pairs.
    pub metadata: BTreeMap<String, String>,
    /// `re_…` at the processor.
    pub processor_refund_id: Option<String>,
    /// Unix seconds.
    pub created: i64,
}

impl Refund {
    /// The public representation, members in the documented order.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&Representation {
            id: &self.id,
            object: "refund",
            payment: &self.payment_id,
            amount: self.amount,
            currency: self.currency,
            status: self.status,
            reason: self.reason,
            metadata: &self.metadata,
            processor_refund_id: self.processor_refund_id.as_deref(),
            created: self.created,
        })
        .unwrap_or_default()
    }
}

/// The values of a new refund, reserved against its payment.
#[derive(Debug)]
pub struct PendingRefund<'a> {
    /// `re_…`
    pub id: &'a RefundId,
    /// The owner.
    pub account_id: &'a AccountId,
    /// The payment.
    pub payment_id: &'a PaymentId,
    /// The creating key.
    pub key_id: i64,
    /// Minor units.
    pub amount: Amount,
    /// The payment's currency.
    pub currency: Currency,
    /// Why.
    pub reason: Option<RefundReason>,
    /// String pairs.
    pub metadata: &'a BTreeMap<String, String>,
}

mod store;

pub use store::{find, find_by_key, insert, list, settle};
