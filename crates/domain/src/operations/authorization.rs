//! What capture and cancel share: both act on a payment's authorization. The first phase locks
//! the payment, marks it `processing` (so no other operation starts on it) and freezes the call;
//! a final refusal reopens it; a call whose answer is lost is reconciled from the charge itself.

use std::time::Duration;

use idem::{Interrupted, Lease, RecoveryPoint, StoredResponse};
use provider::{CardProcessor, Charge, FrozenRequest, ProcessorError};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::reconcile::{Reconciled, adopt_or_move_on, when_nothing_found};
use super::{Context, LeaseInfo, current_payment, internal, problem_answer, record, unavailable};
use crate::DomainError;
use crate::ids::{AccountId, PaymentId};
use crate::money::Amount;
use crate::payments::{self, Changes, Payment, PaymentStatus};
use crate::problems::{Problem, ProblemCode};

/// What the first phase of a capture or cancel decided.
pub(super) enum Gate {
    /// The payment is now `processing`; go on. Its authorization, at the processor.
    Open {
        /// The payment.
        payment_id: PaymentId,
        /// The authorized charge.
        charge_id: String,
    },
    /// A final answer instead.
    Refused(Problem),
}

/// The call a capture or a cancel makes, frozen, built from the payment's id, its charge, the
/// amount to capture and the operation's key (its row id: each operation has its own downstream
/// key, `DownstreamKey::capture`).
pub(super) type PlanCall = fn(&str, &str, Option<Amount>, i64) -> FrozenRequest;

/// The first phase of a capture or a cancel (`action`: "captured" or "canceled") of the payment
/// `payment_id`: opens the gate ([`open_gate`]), then goes on to `next` with the call `plan`
/// builds from the payment, its charge and `capture_amount`, frozen; or stores the refusal.
pub(super) async fn open_phase<P: RecoveryPoint>(
    lease: &mut Lease,
    (account_id, payment_id): (&AccountId, &PaymentId),
    capture_amount: Option<Amount>,
    action: &'static str,
    (next, plan): (P, PlanCall),
    public_base_url: &str,
) -> Result<(), Interrupted> {
    let info = LeaseInfo::of(lease);
    let mut tx = lease.begin().await?;
    match open_gate(&mut tx, account_id, payment_id, capture_amount, action, &info).await? {
        Gate::Open { payment_id, charge_id } => {
            let call = plan(&payment_id, &charge_id, capture_amount, info.key_id);
            tx.commit_call(next, &call).await
        }
        Gate::Refused(problem) => {
            tx.commit_answer(problem_answer(&problem, &info.request_id, public_base_url)).await
        }
    }
}

/// The payment the operation acts on, as it is now, and its authorized charge (it awaits capture,
/// or is being captured or canceled).
pub(super) async fn authorized_payment<P>(
    ctx: &Context<P>,
    account_id: &AccountId,
    payment_id: &PaymentId,
) -> Result<(Payment, String), Interrupted> {
    let payment = current_payment(&ctx.pool, account_id, payment_id).await?;
    let charge_id = payment
        .processor_charge_id
        .clone()
        .ok_or_else(|| internal("an authorized payment without a charge"))?;
    Ok((payment, charge_id))
}

/// Locks the payment; refuses unless it awaits capture; marks it `processing`.
async fn open_gate(
    tx: &mut PgConnection,
    account_id: &AccountId,
    payment_id: &PaymentId,
    capture_amount: Option<Amount>,
    action: &str,
    info: &LeaseInfo,
) -> Result<Gate, DomainError> {
    let payment = payments::lock(tx, account_id, payment_id)
        .await?
        .ok_or(DomainError::NotFound("payment"))?;
    if payment.status != PaymentStatus::RequiresCapture {
        return Ok(Gate::Refused(Problem::new(
            ProblemCode::PaymentUnexpectedState,
            format!(
                "The payment is `{}`; only a payment that `requires_capture` can be {action}.",
                payment.status
            ),
        )));
    }
    if let Some(amount) = capture_amount
        && amount > payment.amount
    {
        return Ok(Gate::Refused(
            Problem::new(
                ProblemCode::AmountTooLarge,
                format!(
                    "`amount_to_capture` ({amount}) is more than the authorized amount ({}).",
                    payment.amount
                ),
            )
            .with_param("amount_to_capture"),
        ));
    }
    let charge_id = payment
        .processor_charge_id
        .clone()
        .ok_or(DomainError::Corrupt("an authorized payment without a charge"))?;
    payments::update(
        tx,
        payment_id,
        &Changes { status: Some(PaymentStatus::Processing), ..Changes::default() },
        None,
    )
    .await?;
    record(tx, account_id, payment_id, &format!("payment.{action}_started"), info, json!({}))
        .await?;
    Ok(Gate::Open { payment_id: payment.id, charge_id })
}

/// After the processor finally refused a capture or a cancel: the payment awaits capture again,
/// and the refusal is the answer.
pub(super) async fn reopen(
    tx: &mut PgConnection,
    payment: &Payment,
    info: &LeaseInfo,
    problem: &Problem,
    public_base_url: &str,
    action: &str,
) -> Result<StoredResponse, DomainError> {
    let changes = Changes { status: Some(PaymentStatus::RequiresCapture), ..Changes::default() };
    payments::update(tx, &payment.id, &changes, None).await?;
    record(tx, &payment.account_id, &payment.id, action, info, json!({"detail": problem.detail}))
        .await?;
    Ok(problem_answer(problem, &info.request_id, public_base_url))
}

/// The processor cannot tell us what the capture or the release `request` of the payment's
/// charge did (`cause`): the charge itself says. `done` decides from the charge whether the call
/// acted: then it is adopted, with the audit detail of its adoption. A charge still only
/// authorized says the call surely did not act: once that can be believed, the call moves to its
/// key's next generation (`None`: the step is over). Anything else needs a person.
pub(super) async fn reconcile_authorization<P: CardProcessor, Pt: RecoveryPoint>(
    ctx: &Context<P>,
    lease: &mut Lease,
    (at, request): (Pt, &FrozenRequest),
    (payment, charge_id): (&Payment, &str),
    what: &str,
    cause: &ProcessorError,
    done: impl Fn(&Charge) -> bool,
) -> Result<Option<(Charge, Value)>, Interrupted> {
    lease.renew().await?;
    let charge = ctx.processor.retrieve_charge(charge_id).await.map_err(|err| unavailable(&err))?;
    let found = if done(&charge) {
        Reconciled::Adopt(charge)
    } else if charge.paid && !charge.captured && charge.amount_refunded == 0 {
        // A charge read is consistent: no lag, only the calls still in flight.
        when_nothing_found(lease, ctx.processor.longest_call(), Duration::ZERO, what).await?
    } else {
        return Err(Interrupted::NeedsHuman {
            reason: format!(
                "the {what} of {charge_id} cannot be reconciled: the charge is captured {} for {}, refunded {}",
                charge.captured, charge.amount_captured, charge.amount_refunded
            ),
        });
    };
    let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
    adopt_or_move_on(lease, at, request, object, what, cause, found).await
}
