//! What a run of a receipt job may do about its receipt, decided on the receipt's locked row:
//! record it, let it through or withhold it for good, and hold its send ([`claim`]); then mark it
//! sent ([`mark_sent`]) or give the hold back after a failed send ([`release`]).

use std::time::Duration;

use sqlx::{PgConnection, PgExecutor, PgPool};

use super::NotSentReason;
use crate::DomainError;
use crate::ids::{AccountId, PaymentId};

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

/// What bounds the sending of receipts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Receipts one account may have let through to be sent in any hour
    /// (`worker.receipts_per_account_per_hour`).
    pub per_account_per_hour: u32,
    /// How long a run holds the send: beyond its longest send.
    pub hold: Duration,
}

/// What a run of a receipt job may do about it ([`claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This run holds the send: send the receipt as recorded, then [`mark_sent`]; after a failed
    /// send, [`release`].
    Send(SendHold),
    /// This run withheld it for good, for this reason: recorded, never sent.
    Withheld(NotSentReason),
    /// A run before sent it or withheld it: nothing to do.
    Settled,
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

/// Records the receipt unless one is recorded; the first time a run may send it, lets it through
/// or withholds it for good ([`Rules`]); and takes the send for `rules.hold` unless it was sent,
/// withheld, or another run holds it.
///
/// All of it is one transaction on the receipt's locked row, so of two runs of one receipt (a job
/// taken over while its run still sends, say) exactly one sends. A run that inserts the row holds
/// its lock to the commit; a concurrent insert waits for it, and the read after it (a statement of
/// its own, so a snapshot taken after that wait) sees the row and its hold.
pub async fn claim(
    pool: &PgPool,
    receipt: &NewReceipt<'_>,
    rules: &Rules,
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
        r#"SELECT account_id AS "account_id: AccountId", email, body,
                  admitted_at IS NOT NULL AS "admitted!",
                  sent_at IS NOT NULL OR not_sent_reason IS NOT NULL AS "settled!",
                  coalesce(sending_until > clock_timestamp(), false) AS "held!"
             FROM receipts WHERE payment_id = $1 FOR UPDATE"#,
        receipt.payment_id as &PaymentId,
    )
    .fetch_one(&mut *tx)
    .await?;
    let withheld = if recorded.settled || recorded.held || recorded.admitted {
        None
    } else {
        withholding(&mut tx, &recorded.account_id, &recorded.email, rules).await?
    };
    let claim = if recorded.settled {
        Claim::Settled
    } else if recorded.held {
        Claim::Busy
    } else if let Some(reason) = withheld {
        sqlx::query!(
            "UPDATE receipts SET not_sent_reason = $2 WHERE payment_id = $1",
            receipt.payment_id as &PaymentId,
            reason as NotSentReason,
        )
        .execute(&mut *tx)
        .await?;
        Claim::Withheld(reason)
    } else {
        let attempt = sqlx::query_scalar!(
            "UPDATE receipts
                SET admitted_at = coalesce(admitted_at, now()),
                    sending_until = clock_timestamp() + $2 * interval '1 millisecond',
                    send_attempts = send_attempts + 1
              WHERE payment_id = $1
             RETURNING send_attempts",
            receipt.payment_id as &PaymentId,
            rules.hold.as_millis() as f64,
        )
        .fetch_one(&mut *tx)
        .await?;
        Claim::Send(SendHold { attempt, email: recorded.email, body: recorded.body })
    };
    tx.commit().await?;
    Ok(claim)
}

/// Why a receipt of `account_id` to `email` may not be let through, if it may not: the address is
/// not one of the account's verified ones (every payment is in test mode), or the account had its
/// quota of receipts let through in the last hour. In the caller's transaction, which lets the
/// receipt through or withholds it before it commits.
async fn withholding(
    tx: &mut PgConnection,
    account_id: &AccountId,
    email: &str,
    rules: &Rules,
) -> Result<Option<NotSentReason>, DomainError> {
    let verified = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM verified_emails
                           WHERE account_id = $1 AND email = lower($2)) AS "verified!""#,
        account_id as &AccountId,
        email,
    )
    .fetch_one(&mut *tx)
    .await?;
    if !verified {
        return Ok(Some(NotSentReason::UnverifiedRecipient));
    }
    // The account's row, locked (not its key: a payment's insert still passes): the receipts of
    // one account are let through one at a time, so the count below and the receipt it lets
    // through commit together, and two runs never both see room for one more. Taken after the
    // receipt's row, as every run takes them.
    sqlx::query!(
        "SELECT id FROM accounts WHERE id = $1 FOR NO KEY UPDATE",
        account_id as &AccountId
    )
    .fetch_optional(&mut *tx)
    .await?;
    let admitted = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM receipts
            WHERE account_id = $1 AND admitted_at > now() - interval '1 hour'"#,
        account_id as &AccountId,
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok((admitted >= i64::from(rules.per_account_per_hour)).then_some(NotSentReason::QuotaExceeded))
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
