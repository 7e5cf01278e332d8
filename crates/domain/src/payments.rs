//! Payments: the validated request, the stored row, its public representation, and the SQL.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::audit::AuditEvent;
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

/// The first phase of a new payment, as one statement that commits on its own: inserts the
/// payment, `processing`, with its `payment.created` audit record, and ends the phase with
/// `idem_commit(fence)` (the idempotency engine's fence, which stores a new key), so that the
/// payment exists exactly when its key records it. Returns the key's id, as `idem_commit` did, and
/// the payment.
pub async fn insert_fenced(
    executor: impl PgExecutor<'_>,
    id: &str,
    account_id: &str,
    request_id: &str,
    request: &CreatePaymentRequest,
    fence: &serde_json::Value,
) -> Result<(i64, Payment), DomainError> {
    let metadata = serde_json::to_value(request.metadata.clone().unwrap_or_default())
        .map_err(|_| DomainError::Corrupt("metadata"))?;
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        WITH fence AS (
            SELECT idem_commit($11) AS key_id
        ), payment AS (
            INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                                  capture_method, payment_method, description, metadata,
                                  receipt_email)
            SELECT $1, $2, fence.key_id, $3, $4, 'processing', $5, $6, $7, $8, $9 FROM fence
            RETURNING *
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT account_id, id, 'payment.created', $10, idempotency_key_id,
                   jsonb_build_object('amount', amount, 'currency', currency)
              FROM payment
        )
        SELECT id, account_id, idempotency_key_id, amount, currency, status, capture_method,
               amount_captured, amount_refunded, payment_method, description, metadata,
               receipt_email, processor_charge_id, failure_code, failure_message,
               cancellation_reason, extract(epoch FROM created_at)::bigint AS "created!"
          FROM payment
        "#,
        id,
        account_id,
        request.amount,
        request.currency,
        request.capture_method.as_str(),
        request.payment_method,
        request.description,
        metadata,
        request.receipt_email,
        request_id,
        fence,
    )
    .fetch_one(executor)
    .await?;
    let key_id =
        row.idempotency_key_id.ok_or(DomainError::Corrupt("a fenced payment without its key"))?;
    Ok((key_id, row.try_into()?))
}

/// A payment of the account.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &str,
    id: &str,
) -> Result<Option<Payment>, DomainError> {
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        SELECT id, account_id, idempotency_key_id, amount, currency, status, capture_method,
               amount_captured, amount_refunded, payment_method, description, metadata,
               receipt_email, processor_charge_id, failure_code, failure_message,
               cancellation_reason, extract(epoch FROM created_at)::bigint AS "created!"
          FROM payments WHERE account_id = $1 AND id = $2
        "#,
        account_id,
        id
    )
    .fetch_optional(executor)
    .await?;
    row.map(Payment::try_from).transpose()
}

/// The payment created by an idempotency key.
pub async fn find_by_key(
    executor: impl PgExecutor<'_>,
    key_id: i64,
) -> Result<Option<Payment>, DomainError> {
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        SELECT id, account_id, idempotency_key_id, amount, currency, status, capture_method,
               amount_captured, amount_refunded, payment_method, description, metadata,
               receipt_email, processor_charge_id, failure_code, failure_message,
               cancellation_reason, extract(epoch FROM created_at)::bigint AS "created!"
          FROM payments WHERE idempotency_key_id = $1
        "#,
        key_id
    )
    .fetch_optional(executor)
    .await?;
    row.map(Payment::try_from).transpose()
}

/// Whether payment `id` exists (of any account), and the idempotency key that creates it (`None`
/// for one created without). For news from the processor, which knows our ids, not our accounts.
pub async fn creation_key(
    executor: impl PgExecutor<'_>,
    id: &str,
) -> Result<Option<Option<i64>>, DomainError> {
    let row = sqlx::query!("SELECT idempotency_key_id FROM payments WHERE id = $1", id)
        .fetch_optional(executor)
        .await?;
    Ok(row.map(|r| r.idempotency_key_id))
}

/// A payment of the account, locked until the transaction ends.
pub async fn lock(
    conn: &mut PgConnection,
    account_id: &str,
    id: &str,
) -> Result<Option<Payment>, DomainError> {
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        SELECT id, account_id, idempotency_key_id, amount, currency, status, capture_method,
               amount_captured, amount_refunded, payment_method, description, metadata,
               receipt_email, processor_charge_id, failure_code, failure_message,
               cancellation_reason, extract(epoch FROM created_at)::bigint AS "created!"
          FROM payments WHERE account_id = $1 AND id = $2
           FOR UPDATE
        "#,
        account_id,
        id
    )
    .fetch_optional(conn)
    .await?;
    row.map(Payment::try_from).transpose()
}

/// The changes a phase makes to a payment; `None` leaves a column as it is.
#[derive(Debug, Default)]
pub struct Changes<'a> {
    /// New status.
    pub status: Option<PaymentStatus>,
    /// New captured amount.
    pub amount_captured: Option<i64>,
    /// Added to the refunded amount (negative to give a reservation back).
    pub refunded_delta: i64,
    /// The processor's charge.
    pub processor_charge_id: Option<&'a str>,
    /// Decline code.
    pub failure_code: Option<&'a str>,
    /// Decline message.
    pub failure_message: Option<&'a str>,
    /// Cancel reason.
    pub cancellation_reason: Option<&'a str>,
    /// New description: `Some(None)` removes it.
    pub description: Option<Option<&'a str>>,
    /// New metadata.
    pub metadata: Option<&'a BTreeMap<String, String>>,
}

/// Applies `changes` and returns the payment as it now is; with `audit`, writes that audit
/// record in the same statement.
pub async fn update(
    conn: &mut PgConnection,
    id: &str,
    changes: &Changes<'_>,
    audit: Option<&AuditEvent<'_>>,
) -> Result<Payment, DomainError> {
    let metadata = changes
        .metadata
        .map(serde_json::to_value)
        .transpose()
        .map_err(|_| DomainError::Corrupt("metadata"))?;
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        WITH updated AS (
        UPDATE payments
           SET status = coalesce($2, status),
               amount_captured = coalesce($3, amount_captured),
               amount_refunded = amount_refunded + $4,
               processor_charge_id = coalesce($5, processor_charge_id),
               failure_code = coalesce($6, failure_code),
               failure_message = coalesce($7, failure_message),
               cancellation_reason = coalesce($8, cancellation_reason),
               description = CASE WHEN $9 THEN $10 ELSE description END,
               metadata = coalesce($11, metadata),
               updated_at = now()
         WHERE id = $1
        RETURNING *
        ), audit AS (
            INSERT INTO audit_events (account_id, object_id, action, request_id,
                                      idempotency_key_id, detail)
            SELECT account_id, id, $12, $13, $14, $15 FROM updated WHERE $12::text IS NOT NULL
        )
        SELECT id, account_id, idempotency_key_id, amount, currency, status, capture_method,
               amount_captured, amount_refunded, payment_method, description, metadata,
               receipt_email, processor_charge_id, failure_code, failure_message,
               cancellation_reason, extract(epoch FROM created_at)::bigint AS "created!"
          FROM updated
        "#,
        id,
        changes.status.map(PaymentStatus::as_str),
        changes.amount_captured,
        changes.refunded_delta,
        changes.processor_charge_id,
        changes.failure_code,
        changes.failure_message,
        changes.cancellation_reason,
        changes.description.is_some(),
        changes.description.flatten(),
        metadata,
        audit.map(|event| event.action),
        audit.map(|event| event.request_id),
        audit.map(|event| event.idempotency_key_id),
        audit.map(|event| &event.detail),
    )
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// Which side of a cursor a page lies on.
#[derive(Debug, Clone)]
pub enum Cursor {
    /// Older than this id.
    After(String),
    /// Newer than this id.
    Before(String),
}

/// A page of the account's payments, newest first, and whether more lie beyond it. `None` when
/// the cursor names no payment of the account.
pub async fn list(
    executor: impl PgExecutor<'_>,
    account_id: &str,
    limit: i64,
    cursor: Option<&Cursor>,
) -> Result<Option<(Vec<Payment>, bool)>, DomainError> {
    let (after, before) = match cursor {
        None => (None, None),
        Some(Cursor::After(id)) => (Some(id.as_str()), None),
        Some(Cursor::Before(id)) => (None, Some(id.as_str())),
    };
    // One statement: the cursor's position, whether it exists, and the page (one extra row tells
    // whether there is more), ordered by (created_at, seq). Each direction is its own branch, a
    // walk of (account_id, created_at DESC, seq DESC) from the cursor that stops at `limit + 1`
    // rows; the branches not asked for are switched off by a one-time filter on the parameters
    // (no `ORDER BY CASE`, which would sort the whole account). The cursor's position is given
    // as scalar subqueries, so that it becomes the index scan's start rather than a join filter
    // over every newer row. Going backwards reads ascending and is turned around below.
    let rows = sqlx::query!(
        r#"
        WITH cursor AS (
            SELECT created_at, seq FROM payments
             WHERE account_id = $1 AND id = coalesce($3, $4)
        )
        SELECT p.seq AS "seq?",
               (extract(epoch FROM p.created_at) * 1000000)::bigint AS "created_us?",
               p.id AS "id?", p.account_id AS "account_id?", p.idempotency_key_id,
               p.amount AS "amount?",
               p.currency AS "currency?", p.status AS "status?", p.capture_method AS "capture_method?",
               p.amount_captured AS "amount_captured?", p.amount_refunded AS "amount_refunded?",
               p.payment_method AS "payment_method?", p.description, p.metadata AS "metadata?",
               p.receipt_email, p.processor_charge_id, p.failure_code, p.failure_message,
               p.cancellation_reason,
               extract(epoch FROM p.created_at)::bigint AS "created?",
               (coalesce($3, $4) IS NULL OR EXISTS (SELECT 1 FROM cursor)) AS "cursor_found!"
          FROM (SELECT 1) one
          LEFT JOIN LATERAL (
              (SELECT * FROM payments
                WHERE $3::text IS NULL AND $4::text IS NULL AND account_id = $1
                ORDER BY created_at DESC, seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM payments q
                WHERE $3::text IS NOT NULL AND q.account_id = $1
                  AND (q.created_at, q.seq)
                      < ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at DESC, q.seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM payments q
                WHERE $4::text IS NOT NULL AND q.account_id = $1
                  AND (q.created_at, q.seq)
                      > ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at, q.seq
                LIMIT $2::bigint + 1)
          ) p ON true
        "#,
        account_id,
        limit,
        after,
        before,
    )
    .fetch_all(executor)
    .await?;
    if !rows.first().is_some_and(|r| r.cursor_found) {
        return Ok(None);
    }
    let mut payments = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for r in rows {
        let (
            Some(id),
            Some(account_id),
            Some(amount),
            Some(currency),
            Some(status),
            Some(capture_method),
        ) = (r.id, r.account_id, r.amount, r.currency, r.status, r.capture_method)
        else {
            continue; // the LEFT JOIN's empty row: no payments on this page
        };
        positions.push((r.created_us.unwrap_or_default(), r.seq.unwrap_or_default()));
        payments.push(Payment::try_from(PaymentRow {
            id,
            account_id,
            idempotency_key_id: r.idempotency_key_id,
            amount,
            currency,
            status,
            capture_method,
            amount_captured: r.amount_captured.unwrap_or_default(),
            amount_refunded: r.amount_refunded.unwrap_or_default(),
            payment_method: r.payment_method.unwrap_or_default(),
            description: r.description,
            metadata: r.metadata.unwrap_or_default(),
            receipt_email: r.receipt_email,
            processor_charge_id: r.processor_charge_id,
            failure_code: r.failure_code,
            failure_message: r.failure_message,
            cancellation_reason: r.cancellation_reason,
            created: r.created.unwrap_or_default(),
        })?);
    }
    let payments = in_walk_order(payments, positions, before.is_some());
    Ok(Some(finish_page(payments, limit, before.is_some())))
}

/// Rows in the order their branch walked them (newest first; oldest first going backwards):
/// the order of a `UNION ALL` is not promised, so it is restored from each row's position.
pub(crate) fn in_walk_order<T>(
    items: Vec<T>,
    positions: Vec<(i64, i64)>,
    backwards: bool,
) -> Vec<T> {
    let mut keyed: Vec<_> = positions.into_iter().zip(items).collect();
    keyed.sort_by(|(a, _), (b, _)| if backwards { a.cmp(b) } else { b.cmp(a) });
    keyed.into_iter().map(|(_, item)| item).collect()
}

/// A page read with one row more than `limit`: trimmed, with whether there is more, newest
/// first (a page read backwards, oldest first, is turned around).
pub(crate) fn finish_page<T>(mut items: Vec<T>, limit: i64, backwards: bool) -> (Vec<T>, bool) {
    let limit = usize::try_from(limit).unwrap_or(0);
    let has_more = items.len() > limit;
    items.truncate(limit);
    if backwards {
        items.reverse();
    }
    (items, has_more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CreatePaymentRequest {
        CreatePaymentRequest {
            amount: 500,
            currency: "usd".into(),
            payment_method: "pm_card_visa".into(),
            capture_method: CaptureMethod::Automatic,
            description: None,
            metadata: None,
            receipt_email: None,
        }
    }

    fn param_of(request: &CreatePaymentRequest) -> Option<&'static str> {
        match request.validate() {
            Err(DomainError::Invalid { param, .. }) => Some(param),
            _ => None,
        }
    }

    #[test]
    fn every_rule_names_its_parameter() {
        assert_eq!(param_of(&request()), None);
        assert_eq!(param_of(&CreatePaymentRequest { amount: 0, ..request() }), Some("amount"));
        assert_eq!(
            param_of(&CreatePaymentRequest { amount: 100_000_000, ..request() }),
            Some("amount")
        );
        assert_eq!(
            param_of(&CreatePaymentRequest { currency: "USD".into(), ..request() }),
            Some("currency")
        );
        assert_eq!(
            param_of(&CreatePaymentRequest { payment_method: "pm_x".into(), ..request() }),
            Some("payment_method")
        );
        let long = "x".repeat(1001);
        assert_eq!(
            param_of(&CreatePaymentRequest { description: Some(long), ..request() }),
            Some("description")
        );
        let bad_key = BTreeMap::from([("a[b]".to_owned(), "v".to_owned())]);
        assert_eq!(
            param_of(&CreatePaymentRequest { metadata: Some(bad_key), ..request() }),
            Some("metadata")
        );
        let many: BTreeMap<_, _> = (0..51).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        assert_eq!(
            param_of(&CreatePaymentRequest { metadata: Some(many), ..request() }),
            Some("metadata")
        );
        let long_value = BTreeMap::from([("k".to_owned(), "v".repeat(501))]);
        assert_eq!(
            param_of(&CreatePaymentRequest { metadata: Some(long_value), ..request() }),
            Some("metadata")
        );
        for email in ["nope", "a@b", "a b@c.d", "@c.d"] {
            assert_eq!(
                param_of(&CreatePaymentRequest { receipt_email: Some(email.into()), ..request() }),
                Some("receipt_email"),
                "{email}"
            );
        }
        assert_eq!(
            param_of(&CreatePaymentRequest {
                receipt_email: Some("jo@example.com".into()),
                ..request()
            }),
            None
        );
    }

    #[test]
    fn the_etag_follows_the_representation() {
        assert_eq!(Payment::etag_of(b"{}"), Payment::etag_of(b"{}"));
        assert_ne!(Payment::etag_of(b"{}"), Payment::etag_of(b"{ }"));
        assert!(Payment::etag_of(b"{}").starts_with('"'));
    }

    fn row(capture_method: &str) -> PaymentRow {
        PaymentRow {
            id: "pay_1".into(),
            account_id: "acct_1".into(),
            idempotency_key_id: None,
            amount: 500,
            currency: "usd".into(),
            status: "requires_capture".into(),
            capture_method: capture_method.into(),
            amount_captured: 0,
            amount_refunded: 0,
            payment_method: "pm_card_visa".into(),
            description: None,
            metadata: serde_json::json!({}),
            receipt_email: None,
            processor_charge_id: None,
            failure_code: None,
            failure_message: None,
            cancellation_reason: None,
            created: 0,
        }
    }

    #[test]
    fn an_unknown_stored_capture_method_is_an_error_not_a_default() {
        let manual = Payment::try_from(row("manual")).expect("a manual payment reads");
        assert_eq!(manual.capture_method, CaptureMethod::Manual);
        let automatic = Payment::try_from(row("automatic")).expect("an automatic payment reads");
        assert_eq!(automatic.capture_method, CaptureMethod::Automatic);
        for unknown in ["delayed", "", "Manual"] {
            assert!(
                matches!(
                    Payment::try_from(row(unknown)),
                    Err(DomainError::Corrupt("unknown capture method"))
                ),
                "{unknown:?}"
            );
        }
    }

    #[test]
    fn an_unknown_stored_status_is_an_error() {
        assert!(matches!(
            Payment::try_from(PaymentRow { status: "pending".into(), ..row("manual") }),
            Err(DomainError::Corrupt("unknown payment status"))
        ));
    }
}
