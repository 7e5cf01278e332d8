//! Refunds: the validated request, the stored row, its representation, and the SQL.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor};

use crate::DomainError;
use crate::money::AMOUNT_MAX;
use crate::payments::{Cursor, finish_page, in_walk_order, validate_metadata};

/// Why a refund was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    /// A duplicate charge.
    Duplicate,
    /// Fraud.
    Fraudulent,
    /// The customer asked.
    RequestedByCustomer,
}

impl RefundReason {
    /// The stored and sent name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
        }
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
    /// The rules that need no payment to check.
    pub fn validate(&self) -> Result<(), DomainError> {
        if let Some(amount) = self.amount
            && !(1..=AMOUNT_MAX).contains(&amount)
        {
            return Err(DomainError::Invalid {
                param: "amount",
                message: format!("`amount` must be an integer from 1 to {AMOUNT_MAX}."),
            });
        }
        if let Some(metadata) = &self.metadata {
            validate_metadata(metadata)?;
        }
        Ok(())
    }
}

/// A refund as the API shows it (the OpenAPI document's `Refund` is derived from this).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Refund)]
pub struct Representation<'a> {
    /// `re_…`
    #[schema(pattern = "^re_")]
    id: &'a str,
    /// Always `refund`.
    #[schema(pattern = "^refund$")]
    object: &'static str,
    /// The refunded payment, `pay_…`.
    payment: &'a str,
    /// In the currency's minor unit.
    amount: i64,
    currency: &'a str,
    /// `pending`, `succeeded` or `failed`.
    status: &'a str,
    reason: Option<&'a str>,
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
    pub id: String,
    /// The owner.
    pub account_id: String,
    /// The refunded payment.
    pub payment_id: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// `pending`, `succeeded`, `failed`.
    pub status: String,
    /// Why.
    pub reason: Option<String>,
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
            currency: &self.currency,
            status: &self.status,
            reason: self.reason.as_deref(),
            metadata: &self.metadata,
            processor_refund_id: self.processor_refund_id.as_deref(),
            created: self.created,
        })
        .unwrap_or_default()
    }
}

struct RefundRow {
    id: String,
    account_id: String,
    payment_id: String,
    amount: i64,
    currency: String,
    status: String,
    reason: Option<String>,
    metadata: serde_json::Value,
    processor_refund_id: Option<String>,
    created: i64,
}

impl TryFrom<RefundRow> for Refund {
    type Error = DomainError;

    fn try_from(row: RefundRow) -> Result<Self, DomainError> {
        Ok(Self {
            id: row.id,
            account_id: row.account_id,
            payment_id: row.payment_id,
            amount: row.amount,
            currency: row.currency,
            status: row.status,
            reason: row.reason,
            metadata: serde_json::from_value(row.metadata)
                .map_err(|_| DomainError::Corrupt("refund metadata is not string pairs"))?,
            processor_refund_id: row.processor_refund_id,
            created: row.created,
        })
    }
}

/// The values of a new refund.
#[derive(Debug)]
pub struct NewRefund<'a> {
    /// `re_…`
    pub id: &'a str,
    /// The owner.
    pub account_id: &'a str,
    /// The payment.
    pub payment_id: &'a str,
    /// The creating key.
    pub key_id: i64,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: &'a str,
    /// Why.
    pub reason: Option<RefundReason>,
    /// String pairs.
    pub metadata: &'a BTreeMap<String, String>,
}

/// Inserts a `pending` refund.
pub async fn insert(conn: &mut PgConnection, new: &NewRefund<'_>) -> Result<Refund, DomainError> {
    let metadata =
        serde_json::to_value(new.metadata).map_err(|_| DomainError::Corrupt("metadata"))?;
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        INSERT INTO refunds (id, account_id, payment_id, idempotency_key_id, amount, currency,
                             status, reason, metadata)
        VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8)
        RETURNING id, account_id, payment_id, amount, currency, status, reason, metadata,
                  processor_refund_id, extract(epoch FROM created_at)::bigint AS "created!"
        "#,
        new.id,
        new.account_id,
        new.payment_id,
        new.key_id,
        new.amount,
        new.currency,
        new.reason.map(RefundReason::as_str),
        metadata,
    )
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// Marks a refund `succeeded` (with the processor's id) or `failed`.
pub async fn settle(
    conn: &mut PgConnection,
    id: &str,
    processor_refund_id: Option<&str>,
    failure_code: Option<&str>,
) -> Result<Refund, DomainError> {
    let status = if failure_code.is_some() { "failed" } else { "succeeded" };
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        UPDATE refunds SET status = $2, processor_refund_id = $3, failure_code = $4
         WHERE id = $1
        RETURNING id, account_id, payment_id, amount, currency, status, reason, metadata,
                  processor_refund_id, extract(epoch FROM created_at)::bigint AS "created!"
        "#,
        id,
        status,
        processor_refund_id,
        failure_code,
    )
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// A refund of the account.
pub async fn find(
    executor: impl PgExecutor<'_>,
    account_id: &str,
    id: &str,
) -> Result<Option<Refund>, DomainError> {
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        SELECT id, account_id, payment_id, amount, currency, status, reason, metadata,
               processor_refund_id, extract(epoch FROM created_at)::bigint AS "created!"
          FROM refunds WHERE account_id = $1 AND id = $2
        "#,
        account_id,
        id
    )
    .fetch_optional(executor)
    .await?;
    row.map(Refund::try_from).transpose()
}

/// The refund created by an idempotency key.
pub async fn find_by_key(
    executor: impl PgExecutor<'_>,
    key_id: i64,
) -> Result<Option<Refund>, DomainError> {
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        SELECT id, account_id, payment_id, amount, currency, status, reason, metadata,
               processor_refund_id, extract(epoch FROM created_at)::bigint AS "created!"
          FROM refunds WHERE idempotency_key_id = $1
        "#,
        key_id
    )
    .fetch_optional(executor)
    .await?;
    row.map(Refund::try_from).transpose()
}

/// A page of a payment's refunds, newest first. `None` when the cursor names no refund of it.
pub async fn list(
    executor: impl PgExecutor<'_>,
    payment_id: &str,
    limit: i64,
    cursor: Option<&Cursor>,
) -> Result<Option<(Vec<Refund>, bool)>, DomainError> {
    let (after, before) = match cursor {
        None => (None, None),
        Some(Cursor::After(id)) => (Some(id.as_str()), None),
        Some(Cursor::Before(id)) => (None, Some(id.as_str())),
    };
    let rows = sqlx::query!(
        r#"
        WITH cursor AS (
            SELECT created_at, seq FROM refunds WHERE payment_id = $1 AND id = coalesce($3, $4)
        )
        SELECT r.seq AS "seq?",
               (extract(epoch FROM r.created_at) * 1000000)::bigint AS "created_us?",
               r.id AS "id?", r.account_id AS "account_id?", r.payment_id AS "payment_id?",
               r.amount AS "amount?", r.currency AS "currency?", r.status AS "status?", r.reason,
               r.metadata AS "metadata?", r.processor_refund_id,
               extract(epoch FROM r.created_at)::bigint AS "created?",
               (coalesce($3, $4) IS NULL OR EXISTS (SELECT 1 FROM cursor)) AS "cursor_found!"
          FROM (SELECT 1) one
          LEFT JOIN LATERAL (
              (SELECT * FROM refunds
                WHERE $3::text IS NULL AND $4::text IS NULL AND payment_id = $1
                ORDER BY created_at DESC, seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM refunds q
                WHERE $3::text IS NOT NULL AND q.payment_id = $1
                  AND (q.created_at, q.seq)
                      < ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at DESC, q.seq DESC
                LIMIT $2::bigint + 1)
              UNION ALL
              (SELECT q.* FROM refunds q
                WHERE $4::text IS NOT NULL AND q.payment_id = $1
                  AND (q.created_at, q.seq)
                      > ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
                ORDER BY q.created_at, q.seq
                LIMIT $2::bigint + 1)
          ) r ON true
        "#,
        payment_id,
        limit,
        after,
        before,
    )
    .fetch_all(executor)
    .await?;
    if !rows.first().is_some_and(|r| r.cursor_found) {
        return Ok(None);
    }
    let mut refunds = Vec::with_capacity(rows.len());
    let mut positions = Vec::with_capacity(rows.len());
    for r in rows {
        let (
            Some(id),
            Some(account_id),
            Some(payment_id),
            Some(amount),
            Some(currency),
            Some(status),
        ) = (r.id, r.account_id, r.payment_id, r.amount, r.currency, r.status)
        else {
            continue;
        };
        positions.push((r.created_us.unwrap_or_default(), r.seq.unwrap_or_default()));
        refunds.push(Refund::try_from(RefundRow {
            id,
            account_id,
            payment_id,
            amount,
            currency,
            status,
            reason: r.reason,
            metadata: r.metadata.unwrap_or_default(),
            processor_refund_id: r.processor_refund_id,
            created: r.created.unwrap_or_default(),
        })?);
    }
    let refunds = in_walk_order(refunds, positions, before.is_some());
    Ok(Some(finish_page(refunds, limit, before.is_some())))
}
