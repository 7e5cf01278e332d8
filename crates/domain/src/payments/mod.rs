//! Payments: the stored row; its public representation in `representation`. The request and its
//! rules are in `request`; the SQL in `store` (the reference road), `fast_path` and `batch` (its
//! one-statement forms) and `list` (pages); a merge patch in `patch`.

use std::collections::BTreeMap;

use crate::ids::{AccountId, PaymentId};
use crate::money::{Amount, Currency};
use crate::stored::text_enum;

/// The payment-method tokens of test mode, as Stripe's test cards name them.
pub const TEST_PAYMENT_METHODS: &[&str] = &[
    "pm_card_visa",
    "pm_card_mastercard",
    "pm_card_chargeDeclined",
    "pm_card_chargeDeclinedInsufficientFunds",
    "pm_card_chargeDeclinedExpiredCard",
    "pm_card_authenticationRequired",
    "pm_card_authenticationRequiredOnSetup",
    "pm_card_threeDSecure2Required",
];

/// Limits of the free-form fields.
pub const DESCRIPTION_MAX_CHARS: usize = 1000;
/// At most this many metadata pairs.
pub const METADATA_MAX_PAIRS: usize = 50;
/// A metadata key's longest length.
pub const METADATA_KEY_MAX_CHARS: usize = 40;
/// A metadata value's longest length.
pub const METADATA_VALUE_MAX_CHARS: usize = 500;

text_enum! {
    /// Where a payment is in its life.
    #[derive(utoipa::ToSchema)]
    pub enum PaymentStatus {
        /// Between recovery points: a request or the completer is working on it.
        Processing,
        /// The customer must authenticate (3-D Secure) at `next_action`'s URL; the outcome
        /// arrives later, by the processor's webhook or the worker's look at the processor.
        RequiresAction,
        /// Authorized; waits for a capture or a cancel.
        RequiresCapture,
        /// Captured.
        Succeeded,
        /// Declined or refused by the processor.
        Failed,
        /// The authorization was released.
        Canceled,
    }
}

// An unknown stored name is a decode error, never a default: a `manual` payment read as
// `automatic` would be captured with its authorization. (Not a doc comment: the doc is the
// OpenAPI document's description.)
text_enum! {
    /// When the money moves.
    #[derive(Default, utoipa::ToSchema)]
    pub enum CaptureMethod {
        /// Captured with the authorization.
        #[default]
        Automatic,
        /// Authorized now, captured by a later `capture`.
        Manual,
    }
}

text_enum! {
    /// Why a payment was canceled.
    #[derive(utoipa::ToSchema)]
    pub enum CancellationReason {
        /// A duplicate.
        Duplicate,
        /// Fraud.
        Fraudulent,
        /// The customer asked.
        RequestedByCustomer,
        /// Nobody completed it.
        Abandoned,
    }
}

/// A payment as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Payment {
    /// `pay_…`
    pub id: PaymentId,
    /// The owner.
    pub account_id: AccountId,
    /// The idempotency key that created it (the audit records of its later changes name it).
    pub key_id: Option<i64>,
    /// Minor units.
    pub amount: Amount,
    /// ISO 4217.
    pub currency: Currency,
    /// Where it is.
    pub status: PaymentStatus,
    /// When the money moves.
    pub capture_method: CaptureMethod,
    /// Captured so far.
    pub amount_captured: i64,
    /// Refunded or reserved by refunds in flight.
    pub amount_refunded: i64,
    /// The token.
    pub payment_method: String,
    /// Free text.
    pub description: Option<String>,
    /// String pairs.
    pub metadata: BTreeMap<String, String>,
    /// Receipt address.
    pub receipt_email: Option<String>,
    /// `pi_…` at the processor: what every later call addresses.
    pub processor_payment_intent_id: Option<String>,
    /// `ch_…` at the processor.
    pub processor_charge_id: Option<String>,
    /// Where the customer authenticates, while it `requires_action`.
    pub next_action_url: Option<String>,
    /// Decline code.
    pub failure_code: Option<String>,
    /// Decline message.
    pub failure_message: Option<String>,
    /// Why it was canceled.
    pub cancellation_reason: Option<CancellationReason>,
    /// Unix seconds.
    pub created: i64,
}

/// A row of `payments` as the queries in `store` read it: every column decoded to its type, so an
/// unknown status, capture method, cancellation reason or currency is a decode error there.
struct PaymentRow {
    id: PaymentId,
    account_id: AccountId,
    /// The key that created it: what a fenced insert checks its fence by.
    idempotency_key_id: Option<i64>,
    amount: Amount,
    currency: Currency,
    status: PaymentStatus,
    capture_method: CaptureMethod,
    amount_captured: i64,
    amount_refunded: i64,
    payment_method: String,
    description: Option<String>,
    metadata: sqlx::types::Json<BTreeMap<String, String>>,
    receipt_email: Option<String>,
    processor_payment_intent_id: Option<String>,
    processor_charge_id: Option<String>,
    next_action_url: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    cancellation_reason: Option<CancellationReason>,
    created: i64,
    /// The row's version (`xmin`), where the query reads it.
    row_version: Option<i64>,
}

/// A version of a payment's row: the transaction that wrote the row as it is (Postgres'
/// `xmin`). Any change to the row makes a new one; a lock (`FOR UPDATE`) does not. A statement
/// that changes the row only at a version it read knows the row's every column before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowVersion(i64);

impl From<PaymentRow> for Payment {
    fn from(row: PaymentRow) -> Self {
        Self {
            id: row.id,
            account_id: row.account_id,
            key_id: row.idempotency_key_id,
            amount: row.amount,
            currency: row.currency,
            status: row.status,
            capture_method: row.capture_method,
            amount_captured: row.amount_captured,
            amount_refunded: row.amount_refunded,
            payment_method: row.payment_method,
            description: row.description,
            metadata: row.metadata.0,
            receipt_email: row.receipt_email,
            processor_payment_intent_id: row.processor_payment_intent_id,
            processor_charge_id: row.processor_charge_id,
            next_action_url: row.next_action_url,
            failure_code: row.failure_code,
            failure_message: row.failure_message,
            cancellation_reason: row.cancellation_reason,
            created: row.created,
        }
    }
}

/// A statement that reads whole payments as [`PaymentRow`]s, compile-time checked as any
/// `query_as!`: `$with` (the statement's own `WITH …`, or `""`), then the one list of a
/// payment's columns, then `$from` (the row's version, `FROM` and the rest). The rows it reads are
/// named without a prefix.
macro_rules! payment_rows {
    ($with:literal, $from:literal, $($args:tt)*) => {
        sqlx::query_as!(
            PaymentRow,
            $with
                + r#"
        SELECT id AS "id: _", account_id AS "account_id: _", idempotency_key_id,
               amount AS "amount: _", currency AS "currency: _", status AS "status: _",
               capture_method AS "capture_method: _", amount_captured, amount_refunded,
               payment_method, description, metadata AS "metadata: _", receipt_email,
               processor_payment_intent_id, processor_charge_id, next_action_url,
               failure_code, failure_message,
               cancellation_reason AS "cancellation_reason: _",
               extract(epoch FROM created_at)::bigint AS "created!","#
                + $from,
            $($args)*
        )
    };
}

/// As [`payment_rows`], for a statement whose payment `p` may be absent (the right side of a
/// `LEFT JOIN`): the pieces of `$head` (up to and with its own first columns), every column of
/// `p` as an `Option`, then the pieces of `$tail` (its last columns, `FROM` and the rest), as an
/// anonymous record. A list's page is `keyset_page!(payment_rows_if_any, …)`.
macro_rules! payment_rows_if_any {
    ([$($head:literal),*], [$($tail:literal),*], $($args:tt)*) => {
        sqlx::query!(
            $($head +)* r#"
               p.id AS "id?: PaymentId", p.account_id AS "account_id?: AccountId",
               p.idempotency_key_id, p.amount AS "amount?: Amount",
               p.currency AS "currency?: Currency", p.status AS "status?: PaymentStatus",
               p.capture_method AS "capture_method?: CaptureMethod",
               p.amount_captured AS "amount_captured?", p.amount_refunded AS "amount_refunded?",
               p.payment_method AS "payment_method?", p.description,
               p.metadata AS "metadata?: Json<BTreeMap<String, String>>", p.receipt_email,
               p.processor_payment_intent_id, p.processor_charge_id, p.next_action_url,
               p.failure_code, p.failure_message,
               p.cancellation_reason AS "cancellation_reason?: CancellationReason",
               extract(epoch FROM p.created_at)::bigint AS "created?","# $(+ $tail)*,
            $($args)*
        )
    };
}

/// The payment of a record [`payment_rows_if_any`] read, as a [`PaymentRow`] (without its
/// version): `None` when `p` was absent, or when a column every payment has was `NULL` (which a
/// caller that knows `p` is there calls corrupt).
macro_rules! payment_if_any {
    ($r:ident) => {{
        match (
            ($r.id, $r.account_id, $r.amount, $r.currency, $r.status, $r.capture_method),
            ($r.amount_captured, $r.amount_refunded, $r.payment_method, $r.metadata, $r.created),
        ) {
            (
                (
                    Some(id),
                    Some(account_id),
                    Some(amount),
                    Some(currency),
                    Some(status),
                    Some(capture_method),
                ),
                (
                    Some(amount_captured),
                    Some(amount_refunded),
                    Some(payment_method),
                    Some(metadata),
                    Some(created),
                ),
            ) => Some(PaymentRow {
                id,
                account_id,
                idempotency_key_id: $r.idempotency_key_id,
                amount,
                currency,
                status,
                capture_method,
                amount_captured,
                amount_refunded,
                payment_method,
                description: $r.description,
                metadata,
                receipt_email: $r.receipt_email,
                processor_payment_intent_id: $r.processor_payment_intent_id,
                processor_charge_id: $r.processor_charge_id,
                next_action_url: $r.next_action_url,
                failure_code: $r.failure_code,
                failure_message: $r.failure_message,
                cancellation_reason: $r.cancellation_reason,
                created,
                row_version: None,
            }),
            _ => None,
        }
    }};
}

pub mod batch;
mod fast_path;
mod list;
mod patch;
mod representation;
mod request;
mod store;
#[cfg(test)]
mod tests;

pub use fast_path::{Written, insert_claiming, update_fenced};
pub(crate) use list::keyset_page;
pub use list::{Cursor, list};
pub(crate) use list::{finish_page, in_walk_order};
pub use patch::{Patched, PaymentPatch, apply, missing_problem, stale_problem};
pub use representation::{NextAction, RedirectToUrl, Representation};
pub use request::{
    CreatePaymentRequest, NewPayment, validate_description, validate_email, validate_metadata,
    validate_metadata_entry,
};
pub use store::{
    Changes, ChargeRecord, find, find_by_key, insert, lock, lock_by_id, lock_for_news, update,
};
