//! `POST /v1/payments` as the client sends it, and the rules its fields (and a merge patch's) are
//! checked by: what a new payment is made of ([`NewPayment`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::DomainError;
use crate::money::{AMOUNT_MAX, Amount, Currency, SUPPORTED_CURRENCIES};
use crate::text::{self, Lines};

use super::{
    CaptureMethod, DESCRIPTION_MAX_CHARS, METADATA_KEY_MAX_CHARS, METADATA_MAX_PAIRS,
    METADATA_VALUE_MAX_CHARS, TEST_PAYMENT_METHODS,
};

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
    /// Free text, at most 1,000 characters: no control characters but tab and line breaks, no
    /// Unicode format characters (bidirectional overrides, zero-width characters…).
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub description: Option<String>,
    /// At most 50 string pairs; keys of at most 40 characters without `[` or `]`, values of at
    /// most 500; the characters as in `description` (a key is one line).
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
            validate_email("receipt_email", email)?;
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
/// key stores it for the completer.
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
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Where the receipt goes once the payment succeeds.
    pub receipt_email: Option<String>,
}

/// `description` is at most 1,000 characters, of text that may span lines
/// ([`text::check`]: no other control character, no format character).
pub fn validate_description(description: Option<&str>) -> Result<(), DomainError> {
    match description {
        Some(d) if d.chars().count() > DESCRIPTION_MAX_CHARS => Err(invalid(
            "description",
            format!("`description` is at most {DESCRIPTION_MAX_CHARS} characters."),
        )),
        Some(d) => text::check("description", d, Lines::Allowed),
        None => Ok(()),
    }
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
    // A key is one line; a value may span lines, as a description may.
    text::check("metadata", key, Lines::Refused)?;
    if let Some(value) = value {
        text::check("metadata", value, Lines::Allowed)?;
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

/// An address a receipt can go to: at most 254 bytes, `local@domain.tld`, no white space, and no
/// character [`text::check`] refuses (named in the refusal). `param` names the field.
pub fn validate_email(param: &'static str, email: &str) -> Result<(), DomainError> {
    text::check(param, email, Lines::Refused)?;
    let valid = email.len() <= 254
        && !email.chars().any(char::is_whitespace)
        && matches!(email.split_once('@'), Some((local, domain)) if !local.is_empty() && domain.contains('.') && !domain.contains('@') && !domain.starts_with('.') && !domain.ends_with('.'));
    if valid { Ok(()) } else { Err(invalid(param, format!("`{param}` is not an email address."))) }
}
