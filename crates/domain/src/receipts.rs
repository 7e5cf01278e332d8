//! The `receipts` table: one receipt per payment that asked for one, recorded before it is sent
//! and marked when it was. The worker's receipt job and the inspector use these functions.

use sqlx::PgExecutor;

use crate::DomainError;
use crate::ids::{AccountId, PaymentId};
use crate::money::{Amount, Currency};

/// What a receipt says about its payment.
#[derive(Debug, Clone)]
pub struct ReceiptFacts {
    /// The payment's account.
    pub account_id: AccountId,
    /// In minor units.
    pub amount: Amount,
    /// ISO code, lower case.
    pub currency: Currency,
    /// The merchant's description.
    pub description: Option<String>,
    /// The processor's charge.
    pub processor_charge_id: Option<String>,
}

/// The facts of payment `payment_id` that its receipt shows, if the payment exists.
// Reads `payments` (whose SQL lives in `payments.rs`) while that module is being rewritten
// (issue #18); it moves there after.
pub async fn facts(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
) -> Result<Option<ReceiptFacts>, DomainError> {
    let facts = sqlx::query_as!(
        ReceiptFacts,
        r#"SELECT account_id AS "account_id: _", amount AS "amount: _",
                  currency AS "currency: _", description, processor_charge_id
             FROM payments WHERE id = $1"#,
        payment_id as &PaymentId
    )
    .fetch_optional(executor)
    .await?;
    Ok(facts)
}

/// Records the receipt of a payment unless one is recorded; true when it was sent before (a
/// second run of the job finds the first one's receipt through the primary key).
pub async fn record(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
    account_id: &AccountId,
    email: &str,
    body: &str,
) -> Result<bool, DomainError> {
    let sent_before = sqlx::query_scalar!(
        r#"
        WITH recorded AS (
            INSERT INTO receipts (payment_id, account_id, email, body) VALUES ($1, $2, $3, $4)
            ON CONFLICT (payment_id) DO NOTHING
            RETURNING sent_at
        )
        SELECT sent_at IS NOT NULL AS "sent!" FROM recorded
        UNION ALL
        SELECT sent_at IS NOT NULL FROM receipts
         WHERE payment_id = $1 AND NOT EXISTS (SELECT 1 FROM recorded)
        "#,
        payment_id as &PaymentId,
        account_id as &AccountId,
        email,
        body,
    )
    .fetch_optional(executor)
    .await?;
    Ok(sent_before.unwrap_or(false))
}

/// Marks the receipt of a payment sent.
pub async fn mark_sent(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
) -> Result<(), DomainError> {
    sqlx::query!(
        "UPDATE receipts SET sent_at = now() WHERE payment_id = $1 AND sent_at IS NULL",
        payment_id as &PaymentId
    )
    .execute(executor)
    .await?;
    Ok(())
}

/// A receipt as an operator sees it.
#[derive(Debug, Clone)]
pub struct ReceiptLine {
    /// The payment.
    pub payment_id: PaymentId,
    /// Its account.
    pub account_id: AccountId,
    /// Where it went.
    pub email: String,
    /// When it was recorded (UTC).
    pub created: String,
    /// When it was sent (UTC); `None` without an SMTP server.
    pub sent: Option<String>,
}

/// The newest `limit` receipts, newest first.
pub async fn recent(
    executor: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<ReceiptLine>, DomainError> {
    let receipts = sqlx::query_as!(
        ReceiptLine,
        r#"
        SELECT payment_id AS "payment_id: _", account_id AS "account_id: _", email,
               to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS "created!",
               to_char(sent_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS sent
          FROM receipts ORDER BY created_at DESC LIMIT $1
        "#,
        limit
    )
    .fetch_all(executor)
    .await?;
    Ok(receipts)
}
