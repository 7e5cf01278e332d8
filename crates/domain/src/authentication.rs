//! A payment that waits on its customer: it `requires_action` (3-D Secure), and its outcome
//! arrives after the request that created it is over.
//!
//! The create-payment operation finishes its key with the `requires_action` answer (a retry
//! replays it byte for byte) and stages an authentication job in the same phase. From then on
//! the payment has two possible writers, and the outcome is recorded once, by whichever comes
//! first, with the payment's event and webhook deliveries in the same transaction ([`settle`],
//! under the payment's row lock, while it still `requires_action`; or, awaiting a capture, when
//! the processor canceled the authorization):
//!
//! - the processor's webhook (`payment_intent.succeeded`, `…payment_failed`,
//!   `…amount_capturable_updated`, `…canceled`), in `processor_events::receive`;
//! - the worker's authentication job ([`check`]), which asks the processor after
//!   `processor.authentication_check_after_s` if no webhook came, again at that interval, and
//!   once the authentication has expired (`processor.authentication_expires_after_s`) cancels the
//!   PaymentIntent at the processor, under a downstream key of its own, and records the payment
//!   `canceled` (`abandoned`), or what the customer did at the last moment. It also closes the
//!   PaymentIntent of a payment recorded `failed`, which the failed attempt left open.

use std::sync::Arc;
use std::time::Duration;

use provider::{
    CardProcessor, DownstreamKey, FrozenRequest, IntentStatus, PaymentIntent, ProcessorError,
};
use serde_json::json;
use sqlx::{PgConnection, PgPool};

use crate::DomainError;
use crate::audit::{self, AuditEvent};
use crate::events::{self, EventType};
use crate::ids::PaymentId;
use crate::jobs::{AuthenticationJob, Work};
use crate::payments::{self, CancellationReason, Changes, Payment, PaymentStatus};
use crate::processor_events::{self, ExtraCharge, Recorded};

/// The audit action of the create's last phase when its payment waits on its customer.
pub const REQUIRES_ACTION: &str = "payment.requires_action";

/// The audit action of the record of its outcome, whoever learnt it (and whatever it was).
pub const SETTLED: &str = "payment.settled";

/// How a payment that waits on its customer is sent on and looked after.
#[derive(Debug, Clone)]
pub struct AuthenticationSettings {
    /// Where the processor's authentication page sends the customer back
    /// (`processor.return_url`).
    pub return_url: Arc<str>,
    /// How long after the create the worker first asks the processor, and then how often
    /// (`processor.authentication_check_after_s`).
    pub check_after: Duration,
    /// How long the customer has to authenticate before the payment is canceled
    /// (`processor.authentication_expires_after_s`).
    pub expires_after: Duration,
}

impl AuthenticationSettings {
    /// The defaults: back to `public_base_url`, a look after 10 minutes, expiry after an hour.
    pub fn new(public_base_url: &str) -> Self {
        let return_url = format!("{}/", public_base_url.trim_end_matches('/'));
        Self::configured(return_url, Duration::from_secs(600), Duration::from_secs(3600))
    }

    /// These settings.
    pub fn configured(return_url: String, check_after: Duration, expires_after: Duration) -> Self {
        Self { return_url: return_url.into(), check_after, expires_after }
    }

    /// The job that looks after `payment`, staged by the phase that records it `requires_action`
    /// at `now` (the database's unix seconds): the customer has `expires_after` from then, however
    /// long the create took to get there.
    pub fn job(&self, payment: &Payment, now: i64) -> Work {
        let expires_after = i64::try_from(self.expires_after.as_secs()).unwrap_or(i64::MAX);
        Work::Authentication(AuthenticationJob {
            payment_id: payment.id.clone(),
            expires_at: now.saturating_add(expires_after),
        })
    }
}

/// Who learnt the outcome, for the audit record.
#[derive(Debug, Clone, Copy)]
pub enum SettledBy<'a> {
    /// The processor's webhook, this event (`evt_…`).
    Webhook(&'a str),
    /// The worker's authentication job, this one.
    Job(i64),
}

/// What [`settle`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The payment moved to this status; with a success the processor reported that it does not
    /// account for (audited for a person; report it once the transaction commits).
    Recorded(PaymentStatus, Option<ExtraCharge>),
    /// The PaymentIntent has not come to an outcome yet (it still waits on the customer).
    NotYet,
    /// The payment no longer waits (settled already, by the other writer), or it is not the
    /// PaymentIntent the payment records: nothing changed.
    NotWaiting,
}

/// Records the outcome `intent` reports for payment `payment_id`, if it may settle the payment
/// ([`may_settle`]): its status, charge and amounts, its event (and the event's webhook
/// deliveries), its receipt when it succeeded, and an audit record, in the caller's transaction,
/// holding the payment's row until it ends.
pub async fn settle(
    tx: &mut PgConnection,
    payment_id: &PaymentId,
    intent: &PaymentIntent,
    by: SettledBy<'_>,
) -> Result<Settled, DomainError> {
    let Some(payment) = payments::lock_by_id(tx, payment_id).await? else {
        return Ok(Settled::NotWaiting);
    };
    if !may_settle(&payment, intent) {
        return Ok(Settled::NotWaiting);
    }
    let code = intent.decline_code();
    let Some((changes, event)) = outcome(&payment, intent, &code) else {
        return Ok(Settled::NotYet);
    };
    let status = changes.status.unwrap_or(payment.status);
    let (found_by, source) = match by {
        SettledBy::Webhook(event_id) => ("webhook", event_id.to_owned()),
        SettledBy::Job(job_id) => ("job", format!("job_{job_id}")),
    };
    let detail = json!({"payment_intent": intent.id, "status": status, "found_by": found_by});
    let audit = payment.key_id.map(|key_id| AuditEvent {
        account_id: &payment.account_id,
        object_id: &payment.id,
        action: SETTLED,
        request_id: &source,
        idempotency_key_id: key_id,
        detail,
    });
    let recorded = payments::update(tx, &payment.id, &changes, audit.as_ref()).await?;
    if status == PaymentStatus::Succeeded
        && let Some(receipt) = Work::receipt(&recorded)
    {
        audit::stage_job(tx, &receipt).await?;
    }
    events::record(tx, &recorded.account_id, event, &recorded.to_json()).await?;
    let extra = other_success(tx, &recorded, (found_by, &source)).await?;
    Ok(Settled::Recorded(status, extra))
}

/// Whether news of `intent` may settle `payment`: it records that PaymentIntent, and still waits
/// on its customer; or it awaits a capture and the processor canceled the authorization (the
/// expiry's cancel crossed the customer's authentication at the last moment, or the processor
/// released an authorization nobody captured): the payment is canceled, whoever was told
/// otherwise, since no capture can succeed.
fn may_settle(payment: &Payment, intent: &PaymentIntent) -> bool {
    let released =
        payment.status == PaymentStatus::RequiresCapture && intent.status == IntentStatus::Canceled;
    payment.processor_payment_intent_id.as_deref() == Some(intent.id.as_str())
        && (payment.status == PaymentStatus::RequiresAction || released)
}

/// The database's time (unix seconds): what an authentication's expiry is counted by.
pub async fn database_now(conn: &mut PgConnection) -> Result<i64, DomainError> {
    let now = sqlx::query_scalar!(r#"SELECT extract(epoch FROM now())::bigint AS "now!""#)
        .fetch_one(conn)
        .await?;
    Ok(now)
}

/// What the PaymentIntent's outcome does to the payment: its changes and its event (`code`: its
/// decline code, should it have failed); `None` while it has none.
fn outcome<'a>(
    payment: &Payment,
    intent: &'a PaymentIntent,
    code: &'a str,
) -> Option<(Changes<'a>, EventType)> {
    let charge = intent.latest_charge.as_deref();
    let left = Changes { next_action_url: Some(None), ..Changes::default() };
    Some(match intent.status {
        IntentStatus::Succeeded => {
            let received = intent.amount_received.unwrap_or(intent.amount);
            let changes = Changes {
                status: Some(PaymentStatus::Succeeded),
                amount_captured: Some(received.min(payment.amount.get())),
                processor_charge_id: charge,
                ..left
            };
            (changes, EventType::PaymentSucceeded)
        }
        IntentStatus::RequiresCapture => {
            let changes = Changes {
                status: Some(PaymentStatus::RequiresCapture),
                processor_charge_id: charge,
                ..left
            };
            (changes, EventType::PaymentRequiresCapture)
        }
        IntentStatus::RequiresPaymentMethod if intent.last_payment_error.is_some() => {
            let changes = Changes {
                status: Some(PaymentStatus::Failed),
                failure_code: Some(code),
                failure_message: Some(
                    intent.failure_message().unwrap_or("The customer did not authenticate."),
                ),
                processor_charge_id: charge,
                ..left
            };
            (changes, EventType::PaymentFailed)
        }
        IntentStatus::Canceled => {
            let reason = match intent.cancellation_reason.as_deref() {
                Some("duplicate") => CancellationReason::Duplicate,
                Some("fraudulent") => CancellationReason::Fraudulent,
                Some("requested_by_customer") => CancellationReason::RequestedByCustomer,
                _ => CancellationReason::Abandoned,
            };
            let changes = Changes {
                status: Some(PaymentStatus::Canceled),
                cancellation_reason: Some(reason),
                ..left
            };
            (changes, EventType::PaymentCanceled)
        }
        _ => return None,
    })
}

/// A success the processor reported for `payment`, as now recorded, that it does not account
/// for: audited for a person in the same transaction.
async fn other_success(
    tx: &mut PgConnection,
    payment: &Payment,
    found_by: (&'static str, &str),
) -> Result<Option<ExtraCharge>, DomainError> {
    let authorized =
        matches!(payment.status, PaymentStatus::Succeeded | PaymentStatus::RequiresCapture);
    let recorded = if authorized {
        Recorded {
            charge: payment.processor_charge_id.as_deref(),
            intent: payment.processor_payment_intent_id.as_deref(),
        }
    } else {
        Recorded::default()
    };
    let Some(extra) =
        processor_events::other_succeeded_charge(&mut *tx, &payment.id, recorded).await?
    else {
        return Ok(None);
    };
    let (account, key_id) = (&payment.account_id, payment.key_id);
    processor_events::audit_extra_charge(tx, &payment.id, account, key_id, &extra, found_by)
        .await?;
    Ok(Some(extra))
}

/// What the worker's look at a waiting payment came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The payment no longer waits (or never did): the job is done.
    Done,
    /// Still waiting: look again after this.
    Later(Duration),
}

/// The worker's authentication job: asks the processor what became of the payment, records an
/// outcome ([`settle`]), and cancels the PaymentIntent once the authentication has expired. A
/// payment recorded `failed` (its customer failed to authenticate) has its PaymentIntent canceled
/// too: a failed attempt leaves it open at the processor, where the customer's page could confirm
/// it again behind the failed payment. An `Err` is a failure to try again later (the processor
/// did not answer).
pub async fn check<P: CardProcessor>(
    pool: &PgPool,
    processor: &P,
    settings: &AuthenticationSettings,
    job: &AuthenticationJob,
    job_id: i64,
) -> Result<Checked, String> {
    let error = |err: DomainError| err.to_string();
    let (payment, now) = current(pool, &job.payment_id).await.map_err(error)?;
    let Some(payment) = payment else { return Ok(Checked::Done) };
    let Some(intent_id) = payment.processor_payment_intent_id.clone() else {
        return Ok(Checked::Done);
    };
    match payment.status {
        PaymentStatus::RequiresAction => {}
        PaymentStatus::Failed => return close(processor, &payment, &intent_id).await,
        _ => return Ok(Checked::Done),
    }
    let by = SettledBy::Job(job_id);
    let intent = processor.retrieve_payment_intent(&intent_id).await.map_err(|e| e.to_string())?;
    if intent.status != IntentStatus::RequiresAction {
        match record(pool, &payment, &intent, by).await? {
            Settled::Recorded(PaymentStatus::Failed, _) => {
                return close(processor, &payment, &intent_id).await;
            }
            Settled::Recorded(..) => return Ok(Checked::Done),
            // The webhook came first: look again at what it recorded.
            Settled::NotWaiting => return Ok(Checked::Later(Duration::from_secs(1))),
            Settled::NotYet => {}
        }
    }
    if now < job.expires_at {
        let left = Duration::from_secs(u64::try_from(job.expires_at - now).unwrap_or(0));
        return Ok(Checked::Later(settings.check_after.min(left).max(Duration::from_secs(1))));
    }
    let key = DownstreamKey::expiry(payment.id.as_str());
    let intent = cancel(processor, &intent_id, key).await?;
    match record(pool, &payment, &intent, by).await? {
        Settled::Recorded(PaymentStatus::Failed, _) => close(processor, &payment, &intent_id).await,
        Settled::Recorded(..) => Ok(Checked::Done),
        Settled::NotWaiting => Ok(Checked::Later(Duration::from_secs(1))),
        Settled::NotYet => Err(format!("{intent_id} is {:?} after its cancel", intent.status)),
    }
}

/// Cancels the PaymentIntent `intent_id` under `key` (one per payment and purpose, whichever
/// runner sends it), as `abandoned`; the PaymentIntent as it is after the cancel, or as it is
/// when the processor refuses the cancel because it moved on (the customer authenticated, or
/// failed to, at the last moment).
async fn cancel<P: CardProcessor>(
    processor: &P,
    intent_id: &str,
    key: DownstreamKey,
) -> Result<PaymentIntent, String> {
    let request = FrozenRequest::cancel_intent(intent_id, Some("abandoned"), key);
    match processor.cancel_payment_intent(&request).await {
        Ok(intent) => Ok(intent),
        Err(ProcessorError::Invalid { code: Some(code), .. })
            if code == "payment_intent_unexpected_state" =>
        {
            processor.retrieve_payment_intent(intent_id).await.map_err(|e| e.to_string())
        }
        Err(err) => Err(err.to_string()),
    }
}

/// Closes the PaymentIntent of a payment recorded `failed`: canceled, unless it moved on. One
/// that succeeded after all is a charge the payment does not account for: the processor's
/// webhook reports it, and it is audited for a person (`payment.extra_charge`).
async fn close<P: CardProcessor>(
    processor: &P,
    payment: &Payment,
    intent_id: &str,
) -> Result<Checked, String> {
    // A key of its own: under the expiry's, the processor could replay a refusal it kept for an
    // earlier cancel (of a PaymentIntent then `processing`) and leave this one open.
    let intent = cancel(processor, intent_id, DownstreamKey::close(payment.id.as_str())).await?;
    if matches!(intent.status, IntentStatus::Succeeded | IntentStatus::RequiresCapture) {
        tracing::error!(payment_id = %payment.id, intent_id, "the PaymentIntent of a failed payment was authorized after all");
    }
    Ok(Checked::Done)
}

/// [`settle`] in a transaction of its own; an extra charge it audited is reported once that
/// commits.
async fn record(
    pool: &PgPool,
    payment: &Payment,
    intent: &PaymentIntent,
    by: SettledBy<'_>,
) -> Result<Settled, String> {
    let error = |err: DomainError| err.to_string();
    let mut tx = pool.begin().await.map_err(|err| err.to_string())?;
    let settled = settle(&mut tx, &payment.id, intent, by).await.map_err(error)?;
    tx.commit().await.map_err(|err| err.to_string())?;
    if let Settled::Recorded(_, Some(extra)) = &settled {
        processor_events::report_extra_charge(&payment.id, extra, "job");
    }
    Ok(settled)
}

/// Payment `id` as it is now, and the database's time (unix seconds).
async fn current(pool: &PgPool, id: &PaymentId) -> Result<(Option<Payment>, i64), DomainError> {
    // A look, not a claim: the row lock ends with the transaction, at once.
    let mut tx = pool.begin().await?;
    let now = database_now(&mut tx).await?;
    let payment = payments::lock_by_id(&mut tx, id).await?;
    tx.rollback().await?;
    Ok((payment, now))
}
