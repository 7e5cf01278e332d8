//! Payments: the validated request, the stored row and its public representation; the SQL is in
//! `store` (the one module that reads and writes the `payments` table).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::DomainError;
use crate::money::{AMOUNT_MAX, Amount, Currency, SUPPORTED_CURRENCIES};

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

/// Where a payment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
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

impl PaymentStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::RequiresCapture => "requires_capture",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    fn parse(name: &str) -> Result<Self, DomainError> {
        [Self::Processing, Self::RequiresCapture, Self::Succeeded, Self::Failed, Self::Canceled]
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or(DomainError::Corrupt("unknown payment status"))
    }
}

/// When the money moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMethod {
    /// Captured with the authorization.
    #[default]
    Automatic,
    /// Authorized now, captured by a later `capture`.
    Manual,
}

impl CaptureMethod {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Automatic => "automatic",
            Self::Manual => "manual",
        }
    }

    /// The method stored as `name`; an unknown name is a corrupt row, never a default (a
    /// `manual` payment read as `automatic` would be captured with its authorization).
    fn parse(name: &str) -> Result<Self, DomainError> {
        [Self::Automatic, Self::Manual]
            .into_iter()
            .find(|m| m.as_str() == name)
            .ok_or(DomainError::Corrupt("unknown capture method"))
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
    /// Applies the rules of the API contract; the error names the parameter.
    pub fn validate(&self) -> Result<(), DomainError> {
        Amount::new(self.amount).ok_or_else(|| {
            invalid("amount", format!("`amount` must be an integer from 1 to {AMOUNT_MAX}, in the currency's minor unit."))
        })?;
        Currency::new(&self.currency).ok_or_else(|| {
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
        Ok(())
    }
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
    #[schema(pattern = "^pay_")]
    id: &'a str,
    /// Always `payment`.
    #[schema(pattern = "^payment$")]
    object: &'static str,
    /// In the currency's minor unit.
    amount: i64,
    /// Lower-case ISO 4217.
    currency: &'a str,
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
    cancellation_reason: Option<&'a str>,
    /// Unix seconds.
    created: i64,
    /// Always false (test mode).
    livemode: bool,
}

/// A payment as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Payment {
    /// `pay_…`
    pub id: String,
    /// The owner.
    pub account_id: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
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
    pub cancellation_reason: Option<String>,
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
            currency: &self.currency,
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
            cancellation_reason: self.cancellation_reason.as_deref(),
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

struct PaymentRow {
    id: String,
    account_id: String,
    /// The key that created it: what a fenced insert checks its fence by.
    idempotency_key_id: Option<i64>,
    amount: i64,
    currency: String,
    status: String,
    capture_method: String,
    amount_captured: i64,
    amount_refunded: i64,
    payment_method: String,
    description: Option<String>,
    metadata: serde_json::Value,
    receipt_email: Option<String>,
    processor_charge_id: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    cancellation_reason: Option<String>,
    created: i64,
}

impl TryFrom<PaymentRow> for Payment {
    type Error = DomainError;

    fn try_from(row: PaymentRow) -> Result<Self, DomainError> {
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            amount: row.amount,
            currency: row.currency,
            status: PaymentStatus::parse(&row.status)?,
            capture_method: CaptureMethod::parse(&row.capture_method)?,
            amount_captured: row.amount_captured,
            amount_refunded: row.amount_refunded,
            payment_method: row.payment_method,
            description: row.description,
            metadata: serde_json::from_value(row.metadata)
                .map_err(|_| DomainError::Corrupt("payment metadata is not string pairs"))?,
            receipt_email: row.receipt_email,
            processor_charge_id: row.processor_charge_id,
            failure_code: row.failure_code,
            failure_message: row.failure_message,
            cancellation_reason: row.cancellation_reason,
            created: row.created,
        })
    }
}

mod store;
#[cfg(test)]
mod tests;

pub use store::{
    Changes, ChargeRecord, Cursor, find, find_by_key, insert_fenced, list, lock, lock_for_news,
    update,
};
pub(crate) use store::{finish_page, in_walk_order};
