//! What capture and cancel share: both act on a payment's authorization, its PaymentIntent at
//! the processor, and one [`AuthorizationAction`] says which. The first phase locks the payment,
//! marks it `processing` (so no other operation starts on it) and freezes the call. Then the call
//! goes out; a call whose answer is lost, or that the processor refuses because the
//! PaymentIntent moved on already, is reconciled from the PaymentIntent itself; and the last
//! phase records what the call did, or, after a final refusal, reopens the payment.
//!
//! Here: the step's phases and its call. What tells a capture from a cancel (the names each
//! writes, the frozen call, how a PaymentIntent shows the call acted, what the last phase writes)
//! is in `action`.

mod action;

pub(super) use action::AuthorizationAction;

use std::time::Duration;

use idem::{Interrupted, Lease, RecoveryPoint, StoredResponse};
use provider::{
    CardProcessor, ErrorClass, FrozenRequest, IntentStatus, PaymentIntent, ProcessorError,
};
use serde_json::{Value, json};
use sqlx::PgConnection;

use self::action::Acted;
use crate::DomainError;
use crate::audit::{self, Subject};
use crate::events;
use crate::ids::{AccountId, PaymentId};
use crate::jobs::Work;
use crate::operations::reconcile::{
    Reconciled, adopt_or_move_on, adopted, count_reconciliation, frozen_as, moved_on, planned_call,
    refused_at_a_later_generation, when_nothing_found,
};
use crate::operations::{
    Context, Learnt, LeaseInfo, Refused, current_payment, final_outcome, internal, payment_answer,
    problem_answer, record, record_reconciled, unavailable,
};
use crate::payments::{self, Changes, Payment, PaymentStatus};
use crate::problems::{Problem, ProblemCode};

/// What the first phase of a capture or cancel decided.
enum Gate {
    /// The payment is now `processing`; go on. Its authorization, at the processor.
    Open {
        /// The payment.
        payment_id: PaymentId,
        /// The authorized PaymentIntent.
        intent_id: String,
    },
    /// A final answer instead.
    Refused(Problem),
}

/// One capture or cancel, as its operation's step runs it: `action` on the authorization of the
/// account's payment.
pub(super) struct Authorization<'a, P> {
    ctx: &'a Context<P>,
    account_id: &'a AccountId,
    payment_id: &'a PaymentId,
    action: AuthorizationAction,
}

impl<'a, P: CardProcessor> Authorization<'a, P> {
    /// `action` on the authorization of the account's payment `payment_id`.
    pub(super) fn new(
        ctx: &'a Context<P>,
        account_id: &'a AccountId,
        payment_id: &'a PaymentId,
        action: AuthorizationAction,
    ) -> Self {
        Self { ctx, account_id, payment_id, action }
    }

    /// The first phase: opens the gate ([`Self::open_gate`]), then goes on to `next` with the
    /// call frozen; or stores the refusal.
    pub(super) async fn open<Pt: RecoveryPoint>(
        &self,
        lease: &mut Lease,
        next: Pt,
    ) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let mut tx = lease.begin().await?;
        match self.open_gate(&mut tx, &info).await? {
            Gate::Open { payment_id, intent_id } => {
                let call = self.action.frozen_request(&payment_id, &intent_id, info.key_id);
                tx.commit_call(next, &call).await
            }
            Gate::Refused(problem) => {
                let base = &self.ctx.public_base_url;
                tx.commit_answer(problem_answer(&problem, &info.request_id, base)).await
            }
        }
    }

    /// Locks the payment; refuses unless it awaits capture (and, for a capture, holds the
    /// amount), with a code of its own for a payment still waiting on its customer; marks it
    /// `processing`.
    async fn open_gate(
        &self,
        tx: &mut PgConnection,
        info: &LeaseInfo,
    ) -> Result<Gate, DomainError> {
        let payment = payments::lock(tx, self.account_id, self.payment_id)
            .await?
            .ok_or(DomainError::NotFound("payment"))?;
        let names = self.action.names();
        if payment.status == PaymentStatus::RequiresAction {
            return Ok(Gate::Refused(Problem::new(
                ProblemCode::PaymentRequiresAction,
                format!(
                    "The payment `requires_action`: its customer has not authenticated yet, so it \
                     cannot be {} until it `requires_capture`.",
                    names.done
                ),
            )));
        }
        if payment.status != PaymentStatus::RequiresCapture {
            return Ok(Gate::Refused(Problem::new(
                ProblemCode::PaymentUnexpectedState,
                format!(
                    "The payment is `{}`; only a payment that `requires_capture` can be {}.",
                    payment.status, names.done
                ),
            )));
        }
        if let AuthorizationAction::Capture { amount: Some(amount) } = self.action
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
        let intent_id = payment
            .processor_payment_intent_id
            .clone()
            .ok_or(DomainError::Corrupt("an authorized payment without a PaymentIntent"))?;
        payments::update(
            tx,
            self.payment_id,
            &Changes { status: Some(PaymentStatus::Processing), ..Changes::default() },
            None,
        )
        .await?;
        record(tx, self.account_id, self.payment_id, names.started, info, json!({})).await?;
        Ok(Gate::Open { payment_id: payment.id, intent_id })
    }

    /// After the first phase, at the recovery point `at`: sends the call it froze, learns what
    /// the call did (from its answer, or else from the PaymentIntent), and records that in the
    /// last phase, with the answer. A call that moved to its key's next generation ends the step.
    pub(super) async fn act<Pt: RecoveryPoint>(
        &self,
        lease: &mut Lease,
        at: Pt,
    ) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let payment = current_payment(&self.ctx.pool, self.account_id, self.payment_id).await?;
        let intent_id = payment
            .processor_payment_intent_id
            .clone()
            .ok_or_else(|| internal("an authorized payment without a PaymentIntent"))?;
        let request = planned_call(lease).await?;
        frozen_as(&request, "/v1/payment_intents/")?;
        let operation = self.action.names().operation;
        idem::failpoint(|| format!("{operation}.before_call")).await;
        let outcome = self.send(&request).await;
        idem::failpoint(|| format!("{operation}.after_call")).await;
        let (outcome, reconciled) = match outcome {
            Err(err) if err.class() == ErrorClass::Reconcile => {
                match self.reconcile(lease, at, &request, &intent_id, &err).await? {
                    Some((intent, detail)) => (Ok(self.action.acted(&intent)), Some(detail)),
                    None => return Ok(()),
                }
            }
            // Done already: behind the API's back (at the processor, or when the authorization
            // expired) or by an earlier generation of this key. The PaymentIntent says so.
            Err(err) if moved_on(&err) => {
                match self.done_already(lease, &intent_id, &err, &request).await? {
                    Some((intent, detail)) => (Ok(self.action.acted(&intent)), Some(detail)),
                    None => (refused_at_a_later_generation(&request, Err(err))?, None),
                }
            }
            other => (refused_at_a_later_generation(&request, other)?, None),
        };
        let outcome = final_outcome(outcome, &payment.id)?;
        let learnt = Learnt { key: &request.key, reconciled: reconciled.as_ref() };
        let mut tx = lease.begin().await?;
        let answer = self.last_phase(&mut tx, &payment, outcome, learnt, &info).await?;
        tx.commit_answer(answer).await
    }

    /// Sends the frozen call: what it did, or the processor's error. An answer whose
    /// PaymentIntent does not show that the call acted did not say what it did.
    async fn send(&self, request: &FrozenRequest) -> Result<Acted, ProcessorError> {
        let processor = &self.ctx.processor;
        let answer = match self.action {
            AuthorizationAction::Capture { .. } => processor.capture_payment_intent(request).await,
            AuthorizationAction::Cancel { .. } => processor.cancel_payment_intent(request).await,
        }?;
        if !self.action.shows_done(&answer) {
            return Err(ProcessorError::UnknownOutcome {
                message: format!("the call answered with {} {:?}", answer.id, answer.status),
            });
        }
        Ok(self.action.acted(&answer))
    }

    /// The processor refused the call because the PaymentIntent `intent_id` moved on (`cause`):
    /// the PaymentIntent, with the audit detail of its adoption, if it shows that this action
    /// is done; `None` leaves the refusal standing.
    async fn done_already(
        &self,
        lease: &mut Lease,
        intent_id: &str,
        cause: &ProcessorError,
        request: &FrozenRequest,
    ) -> Result<Option<(PaymentIntent, Value)>, Interrupted> {
        lease.renew().await?;
        let processor = &self.ctx.processor;
        let intent =
            processor.retrieve_payment_intent(intent_id).await.map_err(|err| unavailable(&err))?;
        if !self.action.shows_done(&intent) {
            return Ok(None);
        }
        count_reconciliation(self.action.names().what, "adopted");
        let detail = adopted(cause, &intent.id, &request.key);
        Ok(Some((intent, detail)))
    }

    /// The processor cannot tell us what the call `request` at `at` did (`cause`): the
    /// PaymentIntent `intent_id` itself says. One that shows the call acted
    /// ([`AuthorizationAction::shows_done`]) is adopted, with the audit detail of its adoption.
    /// One still only authorized says the call surely did not act: once that can be believed,
    /// the call moves to its key's next generation (`None`: the step is over). Anything else
    /// needs a person.
    async fn reconcile<Pt: RecoveryPoint>(
        &self,
        lease: &mut Lease,
        at: Pt,
        request: &FrozenRequest,
        intent_id: &str,
        cause: &ProcessorError,
    ) -> Result<Option<(PaymentIntent, Value)>, Interrupted> {
        let what = self.action.names().what;
        let processor = &self.ctx.processor;
        lease.renew().await?;
        let intent =
            processor.retrieve_payment_intent(intent_id).await.map_err(|err| unavailable(&err))?;
        let found = if self.action.shows_done(&intent) {
            Reconciled::Adopt(intent)
        } else if intent.status == IntentStatus::RequiresCapture {
            // A PaymentIntent read is consistent: no lag, only the calls still in flight.
            when_nothing_found(lease, processor.longest_call(), Duration::ZERO, what).await?
        } else {
            return Err(Interrupted::NeedsHuman {
                reason: format!(
                    "the {what} of {intent_id} cannot be reconciled: the PaymentIntent is {:?}",
                    intent.status
                ),
            });
        };
        let subject = Subject {
            account_id: self.account_id,
            object_id: self.payment_id,
            action: "payment.reconciled",
        };
        adopt_or_move_on(lease, at, request, subject, what, cause, found).await
    }

    /// The last phase: the payment records what the call did (`succeeded` with the amount
    /// captured and its receipt staged, or `canceled`); or, refused, the payment awaits capture
    /// again and the refusal is the answer.
    async fn last_phase(
        &self,
        tx: &mut PgConnection,
        payment: &Payment,
        outcome: Result<Acted, Refused>,
        learnt: Learnt<'_>,
        info: &LeaseInfo,
    ) -> Result<StoredResponse, DomainError> {
        let names = self.action.names();
        record_reconciled(tx, payment.reconciled(), info, learnt.reconciled).await?;
        let acted = match outcome {
            Ok(acted) => acted,
            Err(refused) => {
                let base = &self.ctx.public_base_url;
                return reopen(tx, payment, info, &refused.problem, base, names.refused).await;
            }
        };
        let payment = payments::update(tx, &payment.id, &acted.changes(), None).await?;
        if let Acted::Captured { .. } = acted
            && let Some(receipt) = Work::receipt(&payment)
        {
            audit::stage_job(tx, &receipt).await?;
        }
        let detail = acted.audit_detail(learnt.key);
        record(tx, &payment.account_id, &payment.id, names.acted, info, detail).await?;
        events::record(tx, &payment.account_id, names.event, &payment.to_json()).await?;
        Ok(payment_answer(200, &payment, false))
    }
}

/// After the processor finally refused a capture or a cancel: the payment awaits capture again,
/// and the refusal is the answer (`action`: the refusal's audit action).
async fn reopen(
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
