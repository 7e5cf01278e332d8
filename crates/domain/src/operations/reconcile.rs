//! The reconciliation every operation shares: the frozen call planned at a recovery point, what a
//! lookup at the processor found when a call's answer cannot be had, the move to a key's next
//! generation when that lookup can be trusted to have found nothing, and, under a later
//! generation, the earlier generation's charge the lookups missed.

use std::time::Duration;

use idem::{Interrupted, Lease, RecoveryPoint};
use provider::{
    Charge, DownstreamKey, ErrorClass, FrozenRequest, PaymentIntent, ProcessorError, ReconcileCause,
};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::{LeaseInfo, record};
use crate::DomainError;
use crate::audit::Subject;
use crate::ids::PaymentId;
use crate::payments::{Payment, PaymentStatus};
use crate::processor_events::{self, ExtraCharge, Recorded};
use crate::refunds::Refund;

/// A frozen request as the key stores it.
pub(super) fn plan_of(request: &FrozenRequest) -> Value {
    serde_json::to_value(request).unwrap_or(Value::Null)
}

/// The call planned at the lease's recovery point, after the fenced check that this lease still
/// holds the key (a holder that lost it stops here, before calling). The phase that moved the
/// key here froze it; a key without one, or with one that does not parse, is never guessed at.
pub(super) async fn planned_call(lease: &mut Lease) -> Result<FrozenRequest, Interrupted> {
    let Some(plan) = lease.before_call().await? else {
        return Err(Interrupted::NeedsHuman {
            reason: "no call was planned at the key's recovery point".to_owned(),
        });
    };
    serde_json::from_value(plan).map_err(|err| Interrupted::NeedsHuman {
        reason: format!("the planned call does not parse: {err}"),
    })
}

/// Refers the key to a person unless `request` was frozen as a call to `path` (a prefix): one
/// frozen by an earlier release as a call to the Charges API (`/v1/charges…`) would be sent again
/// as it was frozen, and its answer, a charge, read as a PaymentIntent would not parse; the
/// search that follows looks for PaymentIntents, finds none, and would move the payment to a
/// next generation that charges the card a second time. A person finishes it with that release,
/// or at the processor.
pub(super) fn frozen_as(request: &FrozenRequest, path: &str) -> Result<(), Interrupted> {
    if request.path.starts_with(path) {
        return Ok(());
    }
    Err(Interrupted::NeedsHuman {
        reason: format!(
            "the call under {} was frozen by an earlier release as POST {}; this release calls {path}",
            request.key, request.path
        ),
    })
}

/// What a lookup at the processor found for a call whose answer we cannot have.
pub(super) enum Reconciled<T> {
    /// The object the call made: answer as if the call had returned it.
    Adopt(T),
    /// Nothing, and the lookup can be trusted: send the call again under the key's next
    /// generation.
    NextGeneration,
}

/// `Reconciled::NextGeneration` if a lookup that found nothing can be trusted, else a wait (the
/// key is released until the lookup can be believed, and looked up again then). Whatever the call made was made
/// before the first answer that could not tell us (or within the longest call of it, for a
/// request still executing), so "nothing" is the truth once that first answer is older than the
/// longest call and the lookup's lag (`Lease::unresolved_for`, by the database clock).
pub(super) async fn when_nothing_found<T>(
    lease: &Lease,
    longest_call: Duration,
    lag: Duration,
    what: &str,
) -> Result<Reconciled<T>, Interrupted> {
    let unresolved_for = lease.unresolved_for().await?;
    let settled_after = longest_call + lag;
    if unresolved_for > settled_after {
        Ok(Reconciled::NextGeneration)
    } else {
        count_reconciliation(what, "not_yet");
        // Not a failed attempt: look again once "nothing" can be believed, not sooner.
        Err(Interrupted::Waiting {
            detail: format!("the processor shows no {what} yet; its lookups may trail the call"),
            retry_in: settled_after - unresolved_for + Duration::from_secs(1),
        })
    }
}

pub(super) fn count_reconciliation(operation: &str, outcome: &'static str) {
    metrics::counter!("reconciliations_total", "object" => operation.to_owned(), "outcome" => outcome)
        .increment(1);
}

fn cause_name(err: &ProcessorError) -> &'static str {
    match err {
        ProcessorError::MustReconcile { cause: ReconcileCause::KeyReused, .. } => "key_reused",
        ProcessorError::MustReconcile { cause: ReconcileCause::ReplayedFailure(_), .. } => {
            "replayed_failure"
        }
        ProcessorError::MustReconcile { cause: ReconcileCause::UnreadableAnswer, .. } => {
            "unreadable_answer"
        }
        err if moved_on(err) => "moved_on",
        _ => "other",
    }
}

/// A refusal that says the PaymentIntent is not in a state for the call (Stripe's
/// `payment_intent_unexpected_state`): it may have been captured or canceled already, behind the
/// API's back or by an earlier generation of the key.
pub(super) fn moved_on(err: &ProcessorError) -> bool {
    matches!(err, ProcessorError::Invalid { code: Some(code), .. } if code == "payment_intent_unexpected_state")
}

/// Moves the call at `at` to its key's next generation, recorded (fenced, with an audit record)
/// before the call is sent again, so that two generations are never in flight.
async fn next_generation<P: RecoveryPoint>(
    lease: &mut Lease,
    at: P,
    request: &FrozenRequest,
    subject: Subject<'_>,
    what: &str,
    cause: &ProcessorError,
) -> Result<(), Interrupted> {
    let next = request.next_generation();
    let info = LeaseInfo::of(lease);
    let detail = json!({
        "outcome": "next_generation", "cause": cause_name(cause),
        "previous_key": request.key.as_str(), "downstream_key": next.key.as_str(),
    });
    let mut tx = lease.begin().await?;
    let Subject { account_id, object_id, action } = subject;
    record(&mut tx, account_id, object_id, action, &info, detail).await?;
    tx.commit_call(at, &next).await?;
    count_reconciliation(what, "next_generation");
    tracing::warn!(key_id = info.key_id, object_id, downstream_key = %next.key, "nothing found at the processor: calling again under the next key generation");
    Ok(())
}

/// Whether a refusal seen under `key` may be stored as the answer, whichever way it was seen:
/// the call's own final answer ([`refused_at_a_later_generation`]), a decline the processor's
/// webhook reported for the key, or a declined charge the processor's search found. Only under
/// the key's first generation. A refusal under a later one (`…/2`) proves nothing about the
/// earlier ones: the lookup that let it go out may have missed what they did (a search that
/// trailed further than its documented lag), and a refusal stored now could stand behind a
/// charge. `Err` refers the key to a person; `refusal` says what was seen ("declined (ch_…)").
pub(super) fn refusal_may_be_stored(
    key: &DownstreamKey,
    refusal: impl FnOnce() -> String,
) -> Result<(), Interrupted> {
    if key.generation_number() <= 1 {
        return Ok(());
    }
    Err(Interrupted::NeedsHuman {
        reason: format!(
            "{key} was {}; what an earlier generation of the key did is not known for sure",
            refusal()
        ),
    })
}

/// The call's answer, unless it is a final refusal that may not be stored
/// ([`refusal_may_be_stored`]): a person looks.
pub(super) fn refused_at_a_later_generation<T>(
    request: &FrozenRequest,
    outcome: Result<T, ProcessorError>,
) -> Result<Result<T, ProcessorError>, Interrupted> {
    if let Err(err) = &outcome
        && err.class() == ErrorClass::Final
    {
        refusal_may_be_stored(&request.key, || format!("refused ({err})"))?;
    }
    Ok(outcome)
}

/// The audit detail of an adopted object.
pub(super) fn adopted(cause: &ProcessorError, object: &str, key: &DownstreamKey) -> Value {
    json!({"outcome": "adopted", "cause": cause_name(cause), "found": object, "downstream_key": key.as_str()})
}

/// An object a lookup can find: the audit record of its adoption names it.
pub(super) trait Found {
    /// The processor's id of it.
    fn id(&self) -> &str;
}

impl Found for Charge {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Found for PaymentIntent {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Found for provider::Refund {
    fn id(&self) -> &str {
        &self.id
    }
}

/// After a lookup for a call whose answer we cannot have (`cause`): what it found, adopted as if
/// the call had returned it, with the audit detail of the adoption; or `None` once nothing was
/// found and the call has moved to its key's next generation (the step is over: the engine runs
/// it again, and it sends the call under the new key). `subject` is what its audit record is
/// about.
pub(super) async fn adopt_or_move_on<P: RecoveryPoint, T: Found>(
    lease: &mut Lease,
    at: P,
    request: &FrozenRequest,
    subject: Subject<'_>,
    what: &str,
    cause: &ProcessorError,
    found: Reconciled<T>,
) -> Result<Option<(T, Value)>, Interrupted> {
    match found {
        Reconciled::Adopt(found) => {
            count_reconciliation(what, "adopted");
            let detail = adopted(cause, found.id(), &request.key);
            Ok(Some((found, detail)))
        }
        Reconciled::NextGeneration => {
            next_generation(lease, at, request, subject, what, cause).await?;
            Ok(None)
        }
    }
}

/// A successful charge the processor reported for the payment other than the one it now records
/// (an earlier generation's, which the lookups missed, or any at all when it records none),
/// audited for a person in the phase that records the outcome. It runs after that phase's update
/// holds the payment's row, as `processor_events::receive` does: news of the other charge is seen
/// here, or sees this record. Under the first generation every attempt sent the one downstream
/// key, and the processor made one charge for it, which a payment that succeeded records: nothing
/// to look for then. A refused payment (declined, or refused outright with no charge) looks
/// whatever the generation: a success reported for it is a charge no phase will adopt.
pub(super) async fn audit_other_charge(
    tx: &mut PgConnection,
    payment: &Payment,
    key: &DownstreamKey,
    info: &LeaseInfo,
) -> Result<Option<ExtraCharge>, DomainError> {
    if key.generation_number() <= 1 && payment.status != PaymentStatus::Failed {
        return Ok(None);
    }
    let recorded = match payment.status {
        PaymentStatus::Failed => Recorded::default(),
        _ => Recorded {
            charge: payment.processor_charge_id.as_deref(),
            intent: payment.processor_payment_intent_id.as_deref(),
        },
    };
    let Some(extra) =
        processor_events::other_succeeded_charge(&mut *tx, &payment.id, recorded).await?
    else {
        return Ok(None);
    };
    let (account, key_id) = (&payment.account_id, Some(info.key_id));
    let found_by = ("phase", &*info.request_id);
    processor_events::audit_extra_charge(tx, &payment.id, account, key_id, &extra, found_by)
        .await?;
    Ok(Some(extra))
}

/// Once the phase that audited it committed: reports an extra charge (the log and the counter).
pub(super) fn report_extra(payment_id: &PaymentId, extra: Option<&ExtraCharge>) {
    if let Some(extra) = extra {
        processor_events::report_extra_charge(payment_id, extra, "phase");
    }
}

impl Payment {
    /// What the audit record of a reconciliation of this payment is about.
    pub(super) fn reconciled(&self) -> Subject<'_> {
        Subject { account_id: &self.account_id, object_id: &self.id, action: "payment.reconciled" }
    }
}

impl Refund {
    /// What the audit record of a reconciliation of this refund is about.
    pub(super) fn reconciled(&self) -> Subject<'_> {
        Subject { account_id: &self.account_id, object_id: &self.id, action: "refund.reconciled" }
    }
}
