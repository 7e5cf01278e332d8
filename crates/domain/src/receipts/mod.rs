//! The `receipts` table: one receipt per payment that asked for one, recorded before it is sent,
//! let through or withheld for good, sent by one run at a time ([`claim`]) and marked when it was.
//! The worker's receipt job and the inspector use these functions.
//!
//! Receipts carry a merchant's text from the platform's sender, so they are bounded where they
//! could be a relay for spam or phishing:
//! - **Test mode**: every payment is a test-mode payment (the server issues only `sk_test_` keys:
//!   [`crate::accounts::SECRET_KEY_PREFIX`]), and a test-mode receipt goes only to one of its
//!   account's verified addresses ([`crate::accounts::verify_email`]). To any other address it is
//!   recorded, rendered as it would have gone, and withheld: [`NotSentReason::UnverifiedRecipient`].
//! - **A quota**: an account may have [`Rules::per_account_per_hour`] receipts let through in any
//!   hour; beyond it they are withheld ([`NotSentReason::QuotaExceeded`]), not retried.
//! - **Its text**: the description passed the free-text check ([`crate::text`]), and the receipt
//!   shows it on one line.

mod claim;

pub use claim::{Claim, NewReceipt, Rules, SendHold, claim, mark_sent, release};
use sqlx::PgExecutor;

use crate::DomainError;
use crate::ids::{AccountId, PaymentId};
use crate::money::{Amount, Currency};
use crate::stored::text_enum;

text_enum! {
    /// Why a receipt is never sent, as its `not_sent_reason` column holds it.
    pub enum NotSentReason {
        /// Test mode, and the address is not one of the account's verified addresses.
        UnverifiedRecipient,
        /// The account had as many receipts let through in the last hour as its quota allows.
        QuotaExceeded,
    }
}

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

/// A receipt as an operator sees it.
#[derive(Debug, Clone)]
pub struct ReceiptLine {
    /// The payment.
    pub payment_id: PaymentId,
    /// Its account.
    pub account_id: AccountId,
    /// Where it goes.
    pub email: String,
    /// When it was recorded (UTC).
    pub created: String,
    /// When it was sent (UTC).
    pub sent: Option<String>,
    /// Why it is never sent, when it is not.
    pub not_sent_reason: Option<NotSentReason>,
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
               to_char(sent_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS sent,
               not_sent_reason AS "not_sent_reason: _"
          FROM receipts ORDER BY created_at DESC LIMIT $1
        "#,
        limit
    )
    .fetch_all(executor)
    .await?;
    Ok(receipts)
}
