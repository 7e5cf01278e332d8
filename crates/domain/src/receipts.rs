//! The `receipts` table: one receipt per payment that asked for one, recorded before it is sent
//! and marked when it was, and the hold of its send that one run at a time takes ([`claim`]). The
//! worker's receipt job and the inspector use these functions.

use std::time::Duration;

use sqlx::{PgExecutor, PgPool};

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

/// A receipt to record: the payment's, rendered.
#[derive(Debug, Clone, Copy)]
pub struct NewReceipt<'a> {
    /// The payment.
    pub payment_id: &'a PaymentId,
    /// Its account.
    pub account_id: &'a AccountId,
    /// Where it goes.
    pub email: &'a str,
    /// Plain text.
    pub body: &'a str,
}

/// What a run of a receipt job may do about it ([`claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This run holds the send: send the receipt as recorded, then [`mark_sent`]; after a failed
    /// send, [`release`].
    Send(SendHold),
    /// Sent before: nothing to do.
    Sent,
    /// Another run holds the send now: try again once its hold may have run out.
    Busy,
}

/// The send of a receipt, held by one run until its hold runs out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendHold {
    /// Which hold this is, fencing its release.
    pub attempt: i32,
    /// The address recorded with the receipt.
    pub email: String,
    /// The body recorded with the receipt: a later run sends what the first recorded, even if
    /// the payment's description changed meanwhile.
    pub body: String,
}

/// Records the receipt unless one is recorded, and takes the send for `hold` unless it was sent
/// or another run holds it.
///
/// The check and the hold are one transaction on the receipt's locked row, so of two runs of one
/// receipt (a job taken over while its run still sends, say) exactly one sends. A run that inserts
/// the row holds its lock to the commit; a concurrent insert waits for it, and the read after it
/// (a statement of its own, so a snapshot taken after that wait) sees the row and its hold.
pub async fn claim(
    pool: &PgPool,
    receipt: &NewReceipt<'_>,
    hold: Duration,
) -> Result<Claim, DomainError> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "INSERT INTO receipts (payment_id, account_id, email, body) VALUES ($1, $2, $3, $4)
         ON CONFLICT (payment_id) DO NOTHING",
        receipt.payment_id as &PaymentId,
        receipt.account_id as &AccountId,
        receipt.email,
        receipt.body,
    )
    .execute(&mut *tx)
    .await?;
    let recorded = sqlx::query!(
        r#"SELECT email, body, sent_at IS NOT NULL AS "sent!",
                  coalesce(sending_until > clock_timestamp(), false) AS "held!"
             FROM receipts WHERE payment_id = $1 FOR UPDATE"#,
        receipt.payment_id as &PaymentId,
    )
    .fetch_one(&mut *tx)
    .await?;
    let claim = if recorded.sent {
        Claim::Sent
    } else if recorded.held {
        Claim::Busy
    } else {
        let attempt = sqlx::query_scalar!(
            "UPDATE receipts
                SET sending_until = clock_timestamp() + $2 * interval '1 millisecond',
                    send_attempts = send_attempts + 1
              WHERE payment_id = $1
             RETURNING send_attempts",
            receipt.payment_id as &PaymentId,
            hold.as_millis() as f64,
        )
        .fetch_one(&mut *tx)
        .await?;
        Claim::Send(SendHold { attempt, email: recorded.email, body: recorded.body })
    };
    tx.commit().await?;
    Ok(claim)
}

/// Marks the receipt of a payment sent, and its hold given back.
pub async fn mark_sent(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
) -> Result<(), DomainError> {
    sqlx::query!(
        "UPDATE receipts SET sent_at = now(), sending_until = NULL
          WHERE payment_id = $1 AND sent_at IS NULL",
        payment_id as &PaymentId
    )
    .execute(executor)
    .await?;
    Ok(())
}

/// Gives back hold `attempt` after a failed send, so the job's next run may send at once; nothing
/// when another hold was taken since (this one ran out).
pub async fn release(
    executor: impl PgExecutor<'_>,
    payment_id: &PaymentId,
    attempt: i32,
) -> Result<(), DomainError> {
    sqlx::query!(
        "UPDATE receipts SET sending_until = NULL
          WHERE payment_id = $1 AND send_attempts = $2 AND sent_at IS NULL",
        payment_id as &PaymentId,
        attempt,
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
