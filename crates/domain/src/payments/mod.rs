//! Payments: the validated request, the stored row and its public representation; the SQL is in
//! `store` (the one module that reads and writes the `payments` table).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};

use crate::DomainError;
use crate::ids::{AccountId, PaymentId};
use crate::money::{AMOUNT_MAX, Amount, Currency, SUPPORTED_CURRENCIES};
use crate::stored::text_enum;

/// The payment-method tokens of test mode, as Stripe's test cards name them.
pub const TEST_PAYMENT_METHODS: &[&str] = &[
    "pm_card_visa",
    "pm_card_mastercard",
    "pm_card_chargeDeclined",
    "pm_card_chargeDeclinedInsufficientFunds",
    "pm_card_chargeDeclinedExpiredCard",
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

/// `POST /v1/payments`, as the client sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePaymentRequest {
    /// In the currency's minor unit (cents).
    #[schema(minimum = 1, maximum = 99_999_999)]
    pub amount: i64,
    /// Lower-case ISO 4217.
    #[schema(pattern = "^[a-z]{3}$", example = "usd")]
    pub currency: String,
    /// A test token: `pm_card_visa`, `pm_card_mastercard`, `pm_card_chargeDeclined`,
    /// `pm_card_chargeDeclinedInsufficientFunds` or `pm_card_chargeDeclinedExpiredCard`.
    #[schema(example = "pm_card_visa")]
    pub payment_method: String,
    /// Default automatic.
    #[serde(default)]
    pub capture_method: CaptureMethod,
    /// Free text, at most 1,000 characters.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub description: Option<String>,
    /// At most 50 string pairs; keys of at most 40 characters without `[` or `]`, values of at
    /// most 500.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Where the worker sends the receipt once the payment succeeds.
    #[serde(default)]
    pub receipt_email: Option<String>,
}

fn invalid(param: &'static str, message: impl Into<String>) -> DomainError {
    DomainError::Invalid { param, message: message.into() }
}

impl CreatePaymentRequest {
    /// Applies the rules of the API contract and keeps what they parsed; the error names the
    /// parameter.
    pub fn validate(&self) -> Result<NewPayment, DomainError> {
        let amount = Amount::new(self.amount).ok_or_else(|| {
            invalid("amount", format!("`amount` must be an integer from 1 to {AMOUNT_MAX}, in the currency's minor unit."))
        })?;
        let currency = Currency::new(&self.currency).ok_or_else(|| {
            invalid(
                "currency",
                format!("`currency` must be one of: {}.", SUPPORTED_CURRENCIES.join(", ")),
            )
        })?;
        if !TEST_PAYMENT_METHODS.contains(&self.payment_method.as_str()) {
            return Err(invalid(
                "payment_method",
                format!(
                    "No such payment method. In test mode use one of: {}.",
                    TEST_PAYMENT_METHODS.join(", ")
                ),
            ));
        }
        validate_description(self.description.as_deref())?;
        if let Some(metadata) = &self.metadata {
            validate_metadata(metadata)?;
        }
        if let Some(email) = &self.receipt_email {
            validate_email(email)?;
        }
        Ok(NewPayment {
            amount,
            currency,
            payment_method: self.payment_method.clone(),
            capture_method: self.capture_method,
            description: self.description.clone(),
            metadata: self.metadata.clone().unwrap_or_default(),
            receipt_email: self.receipt_email.clone(),
        })
    }
}

/// A payment to create: the request as [`CreatePaymentRequest::validate`] parsed it, and as the
/// key stores it for the completer (the members and their JSON are the request's, so that a key
/// stored by an earlier release, which stored the request itself, reads back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewPayment {
    /// In the currency's minor unit.
    pub amount: Amount,
    /// A supported currency.
    pub currency: Currency,
    /// A test token.
    pub payment_method: String,
    /// When the money moves.
    pub capture_method: CaptureMethod,
    /// Free text.
    pub description: Option<String>,
    /// String pairs (none when the request had none).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Where the receipt goes once the payment succeeds.
    pub receipt_email: Option<String>,
}

/// Metadata stored as `null` (a request without any, as an earlier release stored it) as no
/// pairs.
pub(crate) fn null_as_empty<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(Option::<BTreeMap<String, String>>::deserialize(deserializer)?.unwrap_or_default())
}

/// `description` is at most 1,000 characters, of text that may span lines.
pub fn validate_description(description: Option<&str>) -> Result<(), DomainError> {
    match description {
        Some(d) if d.chars().count() > DESCRIPTION_MAX_CHARS => Err(invalid(
            "description",
            format!("`description` is at most {DESCRIPTION_MAX_CHARS} characters."),
        )),
        Some(d) if has_control(d, Lines::Allowed) => Err(control_characters("description")),
        _ => Ok(()),
    }
}

/// Whether a text field may hold line breaks and tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// Tab, line feed and carriage return are text; other control characters are not.
    Allowed,
    /// One line: no control character at all.
    Refused,
}

/// Whether `text` holds a control character (C0, DEL or C1) that the field does not allow.
///
/// NUL is the one that matters most: Postgres refuses it in `text` and `jsonb`, so a NUL that got
/// past validation would turn bad input into a 500. The others have no business in a label
/// either, and would reach logs and dashboards verbatim.
pub fn has_control(text: &str, lines: Lines) -> bool {
    text.chars()
        .any(|c| c.is_control() && !(lines == Lines::Allowed && matches!(c, '\t' | '\n' | '\r')))
}

fn control_characters(param: &'static str) -> DomainError {
    invalid(
        param,
        format!(
            "`{param}` must not contain NUL or other control characters (tab and line breaks excepted where text may span lines)."
        ),
    )
}

/// At most 50 pairs; keys 1 to 40 characters without `[` or `]`; values at most 500 characters.
pub fn validate_metadata(metadata: &BTreeMap<String, String>) -> Result<(), DomainError> {
    if metadata.len() > METADATA_MAX_PAIRS {
        return Err(invalid(
            "metadata",
            format!("`metadata` holds at most {METADATA_MAX_PAIRS} pairs."),
        ));
    }
    for (key, value) in metadata {
        validate_metadata_entry(key, Some(value))?;
    }
    Ok(())
}

/// One metadata pair (`None`: a key a merge patch removes, whose value is not checked).
pub fn validate_metadata_entry(key: &str, value: Option<&str>) -> Result<(), DomainError> {
    let key_chars = key.chars().count();
    if key_chars == 0 || key_chars > METADATA_KEY_MAX_CHARS || key.contains(['[', ']']) {
        return Err(invalid(
            "metadata",
            format!(
                "Metadata keys are 1 to {METADATA_KEY_MAX_CHARS} characters without `[` or `]`."
            ),
        ));
    }
    if has_control(key, Lines::Refused) || value.is_some_and(|v| has_control(v, Lines::Allowed)) {
        return Err(control_characters("metadata"));
    }
    if value.is_some_and(|v| v.chars().count() > METADATA_VALUE_MAX_CHARS) {
        return Err(invalid(
            "metadata",
            format!(
                "Metadata values are at most {METADATA_VALUE_MAX_CHARS} characters (key `{}`).",
                key.escape_debug()
            ),
        ));
    }
    Ok(())
}

fn validate_email(email: &str) -> Result<(), DomainError> {
    let valid = email.len() <= 254
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && matches!(email.split_once('@'), Some((local, domain)) if !local.is_empty() && domain.contains('.') && !domain.contains('@') && !domain.starts_with('.') && !domain.ends_with('.'));
    if valid {
        Ok(())
    } else {
        Err(invalid("receipt_email", "`receipt_email` is not an email address."))
    }
}

/// A payment as the API shows it (the OpenAPI document's `Payment` is derived from this).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Payment)]
pub struct Representation<'a> {
    /// `pay_…`
    #[schema(value_type = String, pattern = "^pay_")]
    id: &'a PaymentId,
    /// Always `payment`.
    #[schema(pattern = "^payment$")]
    object: &'static str,
    /// In the currency's minor unit.
    #[schema(value_type = i64)]
    amount: Amount,
    /// Lower-case ISO 4217.
    #[schema(value_type = String)]
    currency: Currency,
    status: PaymentStatus,
    capture_method: CaptureMethod,
    /// 0 until captured.
    amount_captured: i64,
    /// Refunded, or reserved by refunds in flight.
    amount_refunded: i64,
    /// Everything captured has been refunded.
    refunded: bool,
    /// The test token.
    payment_method: &'a str,
    description: Option<&'a str>,
    #[schema(value_type = BTreeMap<String, String>)]
    metadata: &'a BTreeMap<String, String>,
    receipt_email: Option<&'a str>,
    /// The processor's charge, `ch_…`.
    processor_charge_id: Option<&'a str>,
    /// The decline code of a `failed` payment.
    failure_code: Option<&'a str>,
    /// The decline message of a `failed` payment.
    failure_message: Option<&'a str>,
    /// Why a `canceled` payment was canceled.
    #[schema(value_type = Option<String>)]
    cancellation_reason: Option<CancellationReason>,
    /// Unix seconds.
    created: i64,
    /// Always false (test mode).
    livemode: bool,
}

/// A payment as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Payment {
    /// `pay_…`
    pub id: PaymentId,
    /// The owner.
    pub account_id: AccountId,
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
    /// `ch_…` at the processor.
    pub processor_charge_id: Option<String>,
    /// Decline code.
    pub failure_code: Option<String>,
    /// Decline message.
    pub failure_message: Option<String>,
    /// Why it was canceled.
    pub cancellation_reason: Option<CancellationReason>,
    /// Unix seconds.
    pub created: i64,
}

impl Payment {
    /// The public representation, byte for byte, members in the documented order.
    pub fn to_json(&self) -> Vec<u8> {
        let representation = Representation {
            id: &self.id,
            object: "payment",
            amount: self.amount,
            currency: self.currency,
            status: self.status,
            capture_method: self.capture_method,
            amount_captured: self.amount_captured,
            amount_refunded: self.amount_refunded,
            refunded: self.amount_captured > 0 && self.amount_refunded == self.amount_captured,
            payment_method: &self.payment_method,
            description: self.description.as_deref(),
            metadata: &self.metadata,
            receipt_email: self.receipt_email.as_deref(),
            processor_charge_id: self.processor_charge_id.as_deref(),
            failure_code: self.failure_code.as_deref(),
            failure_message: self.failure_message.as_deref(),
            cancellation_reason: self.cancellation_reason,
            created: self.created,
            livemode: false,
        };
        serde_json::to_vec(&representation).unwrap_or_default()
    }

    /// The strong ETag of a representation: changes exactly when the representation does.
    pub fn etag_of(representation: &[u8]) -> String {
        let digest = Sha256::digest(representation);
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("\"{hex}\"")
    }
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
    processor_charge_id: Option<String>,
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
            processor_charge_id: row.processor_charge_id,
            failure_code: row.failure_code,
            failure_message: row.failure_message,
            cancellation_reason: row.cancellation_reason,
            created: row.created,
        }
    }
}

pub mod batch;
mod patch;
mod store;
#[cfg(test)]
mod tests;

pub use patch::{Patched, PaymentPatch, apply, missing_problem, stale_problem};
pub use store::{
    Changes, ChargeRecord, Cursor, Written, find, find_by_key, insert, insert_claiming, list, lock,
    lock_for_news, update, update_fenced,
};
pub(crate) use store::{finish_page, in_walk_order};
