//! Staged jobs: work that must happen only after a commit, run at least once.
//!
//! A job is claimed with `FOR UPDATE SKIP LOCKED` and pushed out of sight for a while (so a worker
//! that dies mid-job lets another take it later); success marks it done, failure schedules it
//! again with exponential back-off, and after a bound it is dead-lettered for a person. The claim
//! outlasts the longest send (`SEND_TIMEOUT`), and `done`/`failed` are fenced on the claim's
//! attempt number, so a runner whose claim was taken over records nothing. The table's SQL is
//! `payments_domain::jobs`; the receipts' is `payments_domain::receipts`.
//!
//! A receipt goes out only to an address its account verified (every payment is in test mode),
//! and within the account's hourly quota; otherwise it is recorded and withheld for good. It is
//! sent by one run at a time: a run holds its send for a while ([`receipts::claim`]), and another
//! run of the same receipt (a job taken over) waits for that.
//! Receipts are delivered at least once: a crash between the send and its record sends the email
//! again. Every copy carries the same `Message-ID`, derived from the receipt's id (the payment's
//! id), so mail systems and readers can recognise and drop the duplicate.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use payments_domain::jobs::{self, Job, ReceiptJob};
use payments_domain::money::{Amount, Currency};
use payments_domain::receipts::{Claim, NewReceipt, NotSentReason, ReceiptFacts, Rules};
use payments_domain::{DomainError, PaymentId, receipts};
use payments_settings::WorkerSettings;
use sqlx::PgPool;

/// The longest one send may take, the whole SMTP conversation included; a send cut off here
/// fails and is retried later.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a run holds the send of a receipt ([`receipts::Rules::hold`]): beyond the longest send, so
/// that a slow send is never sent again beside it, and within a job's claim, so that the run that
/// takes a job over from a dead one finds the dead one's hold run out and sends.
const SEND_HOLD: Duration = Duration::from_secs(2 * 60);
const _: () = assert!(SEND_HOLD.as_secs() > SEND_TIMEOUT.as_secs());

/// How long a claimed job stays out of sight before another worker may take it: well beyond the
/// longest send, so that a slow send is not taken over (and sent again) while it runs.
pub(crate) const CLAIM: Duration = Duration::from_secs(5 * 60);
const _: () = assert!(CLAIM.as_secs() > 2 * SEND_TIMEOUT.as_secs());
const _: () = assert!(CLAIM.as_secs() > SEND_HOLD.as_secs());

/// The `Message-ID` of every copy of a payment's receipt: derived from the receipt's id (its
/// payment's id), so a copy sent twice is recognisably the same message.
pub fn message_id(payment_id: &str, domain: &str) -> String {
    format!("<receipt.{payment_id}@{domain}>")
}

/// A receipt, rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The payment.
    pub payment_id: PaymentId,
    /// Where it goes.
    pub email: String,
    /// The subject line.
    pub subject: String,
    /// Plain text.
    pub body: String,
}

/// Sends receipts.
pub trait Mailer: Send + Sync + 'static {
    /// Sends one receipt; an error is retried later.
    fn send<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), String>>;
}

/// The mailer when no SMTP server is configured: the receipt is recorded in the `receipts` table
/// (as every receipt is) and written to the log.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogMailer;

impl Mailer for LogMailer {
    fn send<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            tracing::info!(payment_id = %receipt.payment_id, subject = %receipt.subject, "receipt recorded (no SMTP server configured)");
            Ok(())
        })
    }
}

/// Sends receipts through an SMTP server.
pub struct SmtpMailer {
    transport: lettre::AsyncSmtpTransport<lettre::Tokio1Executor>,
    from: lettre::message::Mailbox,
}

impl std::fmt::Debug for SmtpMailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpMailer").field("from", &self.from).finish_non_exhaustive()
    }
}

impl SmtpMailer {
    /// A mailer for `smtp://…` or `smtps://…`.
    pub fn new(url: &str, from: &str) -> anyhow::Result<Self> {
        let transport = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::from_url(url)
            .map_err(|err| anyhow::anyhow!("worker.smtp_url: {err}"))?
            .timeout(Some(SEND_TIMEOUT))
            .build();
        let from = from.parse().map_err(|err| anyhow::anyhow!("worker.receipt_from: {err}"))?;
        Ok(Self { transport, from })
    }
}

impl Mailer for SmtpMailer {
    fn send<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), String>> {
        use lettre::AsyncTransport;
        Box::pin(async move {
            let to = receipt.email.parse().map_err(|err| format!("bad address: {err}"))?;
            let message = lettre::Message::builder()
                .from(self.from.clone())
                .to(to)
                .message_id(Some(message_id(&receipt.payment_id, self.from.email.domain())))
                .subject(&receipt.subject)
                .body(receipt.body.clone())
                .map_err(|err| err.to_string())?;
            // The transport's own timeout bounds each read and write; this bounds the whole.
            match tokio::time::timeout(SEND_TIMEOUT, self.transport.send(message)).await {
                Ok(sent) => sent.map(drop).map_err(|err| err.to_string()),
                Err(_) => Err(format!("the send took longer than {} s", SEND_TIMEOUT.as_secs())),
            }
        })
    }
}

/// Claims up to `limit` due jobs other than webhook deliveries (receipts), each for `CLAIM` (the
/// table's SQL is `payments_domain::jobs`; deliveries are `payments_domain::deliveries`).
pub async fn claim(pool: &PgPool, limit: u32) -> Result<Vec<Job>, DomainError> {
    jobs::claim(pool, limit, CLAIM).await
}

/// What a run of a receipt job came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptOutcome {
    /// This run sent it.
    Sent,
    /// This run withheld it for good, for this reason: recorded, never sent.
    Withheld(NotSentReason),
    /// A run before sent it or withheld it.
    Settled,
}

/// Runs receipt jobs: a mailer, and the rules that bound what it sends.
pub struct ReceiptSender {
    mailer: Arc<dyn Mailer>,
    rules: Rules,
}

impl std::fmt::Debug for ReceiptSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiptSender").field("rules", &self.rules).finish_non_exhaustive()
    }
}

impl ReceiptSender {
    /// Sends through `mailer`, under the quota of `settings`.
    pub fn new(mailer: Arc<dyn Mailer>, settings: &WorkerSettings) -> Self {
        let per_account_per_hour = settings.receipts_per_account_per_hour;
        Self { mailer, rules: Rules { per_account_per_hour, hold: SEND_HOLD } }
    }

    /// Runs a receipt job: records the receipt (one per payment); the first time, lets it through
    /// or withholds it for good (an address the account has not verified, in test mode; the
    /// account's hourly quota spent); and sends it unless it was sent or withheld, holding its
    /// send meanwhile ([`receipts::claim`]). While another run holds the send this one fails, to
    /// be tried again later: it neither sends a second copy nor drops the receipt (that run may
    /// yet die before it records the send).
    pub async fn send(&self, pool: &PgPool, job: &ReceiptJob) -> Result<ReceiptOutcome, String> {
        let ReceiptJob { payment_id, email } = job;
        let payment = receipts::facts(pool, payment_id)
            .await
            .map_err(|err| err.to_string())?
            .ok_or("the payment does not exist")?;
        let body = receipt_body(payment_id, &payment);
        let new = NewReceipt { payment_id, account_id: &payment.account_id, email, body: &body };
        let claimed = receipts::claim(pool, &new, &self.rules).await.map_err(|e| e.to_string())?;
        let hold = match claimed {
            Claim::Send(hold) => hold,
            Claim::Withheld(reason) => {
                tracing::info!(%reason, "receipt recorded, not sent");
                metrics::counter!("worker_receipts_total", "outcome" => reason.to_string())
                    .increment(1);
                return Ok(ReceiptOutcome::Withheld(reason));
            }
            Claim::Settled => return Ok(ReceiptOutcome::Settled),
            Claim::Busy => return Err("another run is sending this receipt".into()),
        };
        let receipt = Receipt {
            payment_id: payment_id.clone(),
            email: hold.email,
            subject: format!("Your receipt for payment {payment_id}"),
            body: hold.body,
        };
        if let Err(error) = self.mailer.send(&receipt).await {
            // Given back so the job's next run may send at once; should this fail too, the hold
            // runs out.
            if let Err(release) = receipts::release(pool, payment_id, hold.attempt).await {
                tracing::warn!(error = %release, "the hold of a failed send was not given back");
            }
            return Err(error);
        }
        // Sent: the record is tried again (it is idempotent) for as long as half the hold, since a
        // run that fails here would find the hold run out later and send a second copy.
        let until = std::time::Instant::now() + self.rules.hold / 2;
        let mut pause = Duration::from_millis(100);
        while let Err(err) = receipts::mark_sent(pool, payment_id).await {
            if std::time::Instant::now() + pause >= until {
                return Err(format!("sent, but not recorded as sent: {err}"));
            }
            tracing::warn!(error = %err, "a sent receipt is not recorded yet; trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
        metrics::counter!("worker_receipts_total", "outcome" => "sent").increment(1);
        Ok(ReceiptOutcome::Sent)
    }
}

/// The text of a payment's receipt. The description is the merchant's free text: it is shown on
/// one line (each run of white space, line breaks among it, as one space), so that it cannot add
/// lines that read as the receipt's own.
fn receipt_body(payment_id: &PaymentId, payment: &ReceiptFacts) -> String {
    let description = payment.description.as_deref().map(one_line);
    format!(
        "Thank you for your payment.\n\nPayment: {payment_id}\nAmount: {} {}\nDescription: {}\nCharge: {}\n",
        format_amount(payment.amount, payment.currency),
        payment.currency.as_str().to_uppercase(),
        description.as_deref().unwrap_or("-"),
        payment.processor_charge_id.as_deref().unwrap_or("-"),
    )
}

/// `text` with each run of white space as one space, and none at either end.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `1234` `usd` → `12.34`; zero-decimal currencies have no minor unit.
fn format_amount(amount: Amount, currency: Currency) -> String {
    let amount = amount.get();
    if currency.as_str() == "jpy" {
        amount.to_string()
    } else {
        format!("{}.{:02}", amount / 100, amount % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_written_in_major_units() {
        let written = |amount, code| {
            let (amount, currency) = (Amount::new(amount), Currency::new(code));
            amount.zip(currency).map(|(amount, currency)| format_amount(amount, currency))
        };
        assert_eq!(written(1234, "usd").as_deref(), Some("12.34"));
        assert_eq!(written(5, "eur").as_deref(), Some("0.05"));
        assert_eq!(written(500, "jpy").as_deref(), Some("500"));
    }

    #[test]
    fn a_description_shows_on_one_line_of_the_receipt() {
        let payment = ReceiptFacts {
            account_id: payments_domain::AccountId::generate(),
            amount: Amount::new(1000).unwrap(),
            currency: Currency::new("usd").unwrap(),
            description: Some("Two mugs\n\nYour account is locked:\r\n\tsee example.com ".into()),
            processor_charge_id: None,
        };
        let body = receipt_body(&PaymentId::generate(), &payment);
        let line = "Description: Two mugs Your account is locked: see example.com\n";
        assert!(body.contains(line), "{body}");
        assert_eq!(body.lines().count(), 6, "{body}");
    }
}
