//! `POST /v1/payments`: `started` → `payment_created` → finished. The first phase inserts the
//! payment with the charge frozen; the second calls the processor (or adopts what its webhook
//! reported) and records the outcome with the stored answer.

use std::collections::BTreeMap;

use idem::{Claim, Engine, IdemError, Interrupted, Lease, Operation, Request, StoredResponse};
use provider::{
    CardProcessor, Charge, ChargeRequest, DownstreamKey, ErrorClass, FrozenRequest, ProcessorError,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::reconcile::{
    adopt_or_move_on, audit_other_charge, count_reconciliation, planned_call,
    refused_at_a_later_generation, report_extra,
};
use super::{
    Context, Learnt, LeaseInfo, PaymentOperation, Refused, failure_code, final_problem, internal,
    payment_answer, problem_answer, record_reconciled, unavailable,
};
use crate::DomainError;
use crate::audit;
use crate::audit::AuditEvent;
use crate::events::{self, EventType};
use crate::ids::{AccountId, PaymentId};
use crate::jobs::Work;
use crate::payments::{
    self, CaptureMethod, Changes, NewPayment, Payment, PaymentStatus, RowVersion,
};
use crate::processor_events::ExtraCharge;

mod fast_path;
mod lookups;

/// The stored name of a payment creation.
pub const CREATE_PAYMENT: &str = "payments.create";

recovery_points!(CreatePoint { Started => "started", PaymentCreated => "payment_created" });

/// The stored input of a payment creation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatePaymentParams {
    /// The account.
    pub account_id: AccountId,
    /// The validated request.
    pub request: NewPayment,
}

/// `POST /v1/payments`.
#[derive(Debug)]
pub struct CreatePayment<P> {
    ctx: Context<P>,
    params: CreatePaymentParams,
    /// The payment the first phase made and its row's version, so the next step need not read
    /// it back (and may change it in one statement while the row is still at that version).
    created: Option<(Payment, RowVersion)>,
}

impl<P: CardProcessor> CreatePayment<P> {
    /// The operation for validated input.
    pub fn new(ctx: Context<P>, params: CreatePaymentParams) -> Self {
        Self { ctx, params, created: None }
    }

    /// The payment, with its row's version when the first phase just made it.
    async fn payment(&mut self, key_id: i64) -> Result<(Payment, Option<RowVersion>), Interrupted> {
        if let Some((payment, version)) = self.created.take() {
            return Ok((payment, Some(version)));
        }
        let payment = payments::find_by_key(&self.ctx.pool, key_id)
            .await
            .map_err(internal)?
            .ok_or_else(|| internal("the key is past `payment_created` but has no payment"))?;
        Ok((payment, None))
    }
}

/// The charge request for the payment `payment_id` made of `request`, frozen under its first key.
fn charge_request(
    payment_id: &PaymentId,
    request: &NewPayment,
    metadata: &BTreeMap<String, String>,
) -> FrozenRequest {
    ChargeRequest {
        payment_id: payment_id.to_string(),
        amount: request.amount.get(),
        currency: request.currency.to_string(),
        source: request.payment_method.clone(),
        capture: request.capture_method == CaptureMethod::Automatic,
        description: request.description.clone(),
        metadata: metadata.clone(),
    }
    .freeze(DownstreamKey::charge(payment_id))
}

/// Whether `charge` says it is the payment `payment_id`'s (`metadata[payment_id]`).
fn is_of(charge: &Charge, payment_id: &PaymentId) -> bool {
    charge.metadata.get("payment_id").is_some_and(|id| payment_id == id.as_str())
}

/// Counts a charge adopted from the processor's webhook; the audit detail of its adoption.
fn pushed_adoption(charge_id: &str, key: &DownstreamKey) -> Value {
    count_reconciliation("charge", "adopted");
    json!({"outcome": "adopted", "cause": "webhook", "found": charge_id, "downstream_key": key.as_str()})
}

impl<P: CardProcessor> PaymentOperation<P> for CreatePayment<P> {
    const NAME: &'static str = CREATE_PAYMENT;
    type Params = CreatePaymentParams;

    fn with_params(ctx: &Context<P>, params: CreatePaymentParams) -> Self {
        Self::new(ctx.clone(), params)
    }

    fn params(&self) -> &CreatePaymentParams {
        &self.params
    }
}

impl<P: CardProcessor> Operation for CreatePayment<P> {
    type Point = CreatePoint;

    async fn step(&mut self, lease: &mut Lease, at: CreatePoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        match at {
            // The payment, `processing`, with its audit record, and the charge frozen at
            // `payment_created`. (On the fast path this phase ran in the claim, as one statement:
            // `fast_path::claim_with_payment`.)
            CreatePoint::Started => {
                let id = PaymentId::generate();
                let (account_id, request) = (&self.params.account_id, &self.params.request);
                let call = charge_request(&id, request, &self.ctx.charge_metadata);
                let mut tx = lease.begin().await?;
                let (key_id, request_id) = (info.key_id, &*info.request_id);
                let created =
                    payments::insert(&mut tx, &id, account_id, key_id, request_id, request).await?;
                tx.commit_call(CreatePoint::PaymentCreated, &call).await?;
                self.created = Some(created);
            }
            CreatePoint::PaymentCreated => {
                let (payment, version) = self.payment(info.key_id).await?;
                let request = planned_call(lease).await?;
                let Some(answered) = self.charge(lease, at, &payment, &request).await? else {
                    // Nothing found at the processor: the call moved to its next generation.
                    return Ok(());
                };
                let learnt = Learnt { key: &request.key, reconciled: answered.reconciled.as_ref() };
                match answered.charge {
                    // A charge found by reconciliation may be a declined one.
                    Ok(charge) if charge.paid => {
                        self.record_charge(lease, (&payment, version), &charge, learnt, &info)
                            .await?;
                    }
                    declined => {
                        let refused = refusal_of(declined, &payment)?;
                        let base = &self.ctx.public_base_url;
                        let mut tx = lease.begin().await?;
                        let (answer, extra) =
                            failed(&mut tx, &payment, &refused, learnt, &info, base).await?;
                        tx.commit_answer(answer).await?;
                        report_extra(&payment.id, extra.as_ref());
                    }
                }
            }
        }
        Ok(())
    }

    /// On the fast path the claim is the first phase, one statement (`fast_path.rs`).
    async fn claim(&mut self, engine: &Engine, request: &Request) -> Result<Claim, IdemError> {
        if self.ctx.fast_path {
            return fast_path::claim_with_payment(self, engine, request).await;
        }
        engine.claim(request).await
    }

    fn claims_in_first_phase(&self) -> bool {
        self.ctx.fast_path
    }
}

/// What the charge call came to: the charge (paid or declined) or the processor's error, and
/// what reconciliation or the processor's webhook found when it answered for the call.
struct Answered {
    charge: Result<Charge, ProcessorError>,
    reconciled: Option<Value>,
}

impl<P: CardProcessor> CreatePayment<P> {
    /// Calls the processor with the frozen charge `request`, unless its webhook told us already
    /// what the call made, and reconciles an answer that cannot tell. `None` when reconciliation
    /// found nothing and moved the call to its key's next generation.
    async fn charge(
        &self,
        lease: &mut Lease,
        at: CreatePoint,
        payment: &Payment,
        request: &FrozenRequest,
    ) -> Result<Option<Answered>, Interrupted> {
        let adopted = |charge: Charge| {
            let reconciled = Some(pushed_adoption(&charge.id, &request.key));
            Ok(Some(Answered { charge: Ok(charge), reconciled }))
        };
        // A key's first run made no call under it before: nothing can have been pushed, unless
        // an earlier generation of the key was called.
        if (lease.attempts(), request.key.generation_number()) != (1, 1)
            && let Some(charge) = self.pushed_charge(payment, &request.key).await?
        {
            return adopted(charge);
        }
        idem::failpoint(|| format!("{CREATE_PAYMENT}.before_call")).await;
        let outcome = self.ctx.processor.create_charge(request).await;
        idem::failpoint(|| format!("{CREATE_PAYMENT}.after_call")).await;
        let err = match outcome {
            Ok(charge) if charge.is_decided() => {
                return Ok(Some(Answered { charge: Ok(charge), reconciled: None }));
            }
            Ok(undecided) => {
                let (charge, detail) = self.decided(lease, &request.key, undecided).await?;
                return Ok(Some(Answered { charge: Ok(charge), reconciled: Some(detail) }));
            }
            Err(err) => err,
        };
        match err.class() {
            // No answer: the processor's webhook may have told us meanwhile (it landed while
            // this lease was mid-call).
            ErrorClass::Transient | ErrorClass::UnknownOutcome => {
                match self.pushed_charge(payment, &request.key).await? {
                    Some(charge) => adopted(charge),
                    None => Ok(Some(Answered { charge: Err(err), reconciled: None })),
                }
            }
            ErrorClass::Reconcile => {
                let found = self.reconcile(lease, payment, &request.key, &err).await?;
                let adopted = adopt_or_move_on(
                    lease,
                    at,
                    request,
                    payment.reconciled(),
                    "charge",
                    &err,
                    found,
                )
                .await?;
                Ok(adopted.map(|(charge, detail)| Answered {
                    charge: Ok(charge),
                    reconciled: Some(detail),
                }))
            }
            ErrorClass::Final => {
                let charge = refused_at_a_later_generation(request, Err(err))?;
                Ok(Some(Answered { charge, reconciled: None }))
            }
        }
    }

    /// The last phase when the processor charged the card: [`charged`] in a fenced transaction,
    /// or, on the fast path, one statement when it can be (`fast_path::charged_in_one`).
    async fn record_charge(
        &self,
        lease: &mut Lease,
        (payment, version): (&Payment, Option<RowVersion>),
        charge: &Charge,
        learnt: Learnt<'_>,
        info: &LeaseInfo,
    ) -> Result<(), Interrupted> {
        if let Some(version) = version
            && self.ctx.fast_path
            && learnt.reconciled.is_none()
            && learnt.key.generation_number() == 1
        {
            let (row, batches) = ((payment, version), self.ctx.charged.as_ref());
            if fast_path::charged_in_one(batches, lease, row, charge, learnt.key, info).await? {
                return Ok(());
            }
        }
        let mut tx = lease.begin().await?;
        let (answer, extra) = charged(&mut tx, payment, charge, learnt, info).await?;
        tx.commit_answer(answer).await?;
        report_extra(&payment.id, extra.as_ref());
        Ok(())
    }
}

/// A charge the processor did not make as the refusal stored for it: adopted from a declined
/// charge (its webhook, or the search), the answer the 402 would have been; the decline code is
/// the outcome's reason, `failure_code` the 402's `code`. A failure that is not final interrupts
/// the step.
fn refusal_of(
    declined: Result<Charge, ProcessorError>,
    payment: &Payment,
) -> Result<Refused, Interrupted> {
    let err = match declined {
        Ok(charge) => ProcessorError::Declined {
            decline_code: charge.decline_code(),
            message: charge
                .failure_message
                .clone()
                .unwrap_or_else(|| "Your card was declined.".to_owned()),
            charge_id: Some(charge.id),
            payment_intent: None,
        },
        Err(err) => err,
    };
    let problem = final_problem(&err, &payment.id).ok_or_else(|| unavailable(&err))?;
    Ok(Refused { err, problem })
}

/// The last phase when the processor charged the card: the payment `succeeded` (or
/// `requires_capture` for a manual capture), its receipt staged, its event recorded. Answers the
/// stored answer, and another successful charge for the payment if one was found (and audited).
async fn charged(
    tx: &mut PgConnection,
    payment: &Payment,
    charge: &Charge,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
) -> Result<(StoredResponse, Option<ExtraCharge>), DomainError> {
    record_reconciled(tx, payment.reconciled(), info, learnt.reconciled).await?;
    let recorded = Recorded::of(charge, learnt.key);
    let audit = recorded.audit(payment, info);
    let payment = payments::update(tx, &payment.id, &recorded.changes, Some(&audit)).await?;
    let extra = audit_other_charge(tx, &payment, learnt.key, info).await?;
    if let Some(receipt) = Recorded::receipt(&payment) {
        audit::stage_job(tx, &receipt).await?;
    }
    events::record(tx, &payment.account_id, recorded.event, &payment.to_json()).await?;
    Ok((payment_answer(201, &payment, true), extra))
}

/// What recording a successful charge does to a payment, in either form of the phase.
struct Recorded<'a> {
    changes: Changes<'a>,
    /// The audit record's detail.
    detail: Value,
    event: EventType,
}

impl<'a> Recorded<'a> {
    fn of(charge: &'a Charge, key: &DownstreamKey) -> Self {
        let status =
            if charge.captured { PaymentStatus::Succeeded } else { PaymentStatus::RequiresCapture };
        let changes = Changes {
            status: Some(status),
            amount_captured: Some(charge.amount_captured),
            processor_charge_id: Some(&charge.id),
            ..Changes::default()
        };
        let detail = json!({"charge": charge.id, "downstream_key": key.as_str(), "status": status});
        let event = match status {
            PaymentStatus::Succeeded => EventType::PaymentSucceeded,
            _ => EventType::PaymentRequiresCapture,
        };
        Self { changes, detail, event }
    }

    fn audit<'p>(&self, payment: &'p Payment, info: &'p LeaseInfo) -> AuditEvent<'p> {
        info.audit(&payment.account_id, &payment.id, "payment.charged", self.detail.clone())
    }

    /// The receipt of the payment as recorded, when it succeeded and has an address.
    fn receipt(recorded: &Payment) -> Option<Work> {
        Work::receipt(recorded).filter(|_| recorded.status == PaymentStatus::Succeeded)
    }
}

/// The last phase when the processor refused the charge for good: the payment `failed`, with
/// the processor's code and the problem's detail, its event recorded, and the problem stored as
/// the answer. Answers it, and a successful charge for the payment after all if one was found.
async fn failed(
    tx: &mut PgConnection,
    payment: &Payment,
    refused: &Refused,
    learnt: Learnt<'_>,
    info: &LeaseInfo,
    base: &str,
) -> Result<(StoredResponse, Option<ExtraCharge>), DomainError> {
    record_reconciled(tx, payment.reconciled(), info, learnt.reconciled).await?;
    let Refused { err, problem } = refused;
    let charge_id = match err {
        ProcessorError::Declined { charge_id, .. } => charge_id.as_deref(),
        _ => None,
    };
    let code = failure_code(err);
    let changes = Changes {
        status: Some(PaymentStatus::Failed),
        processor_charge_id: charge_id,
        failure_code: Some(&code),
        failure_message: Some(&problem.detail),
        ..Changes::default()
    };
    let detail = json!({"error": err.to_string()});
    let audit = info.audit(&payment.account_id, &payment.id, "payment.failed", detail);
    let payment = payments::update(tx, &payment.id, &changes, Some(&audit)).await?;
    let extra = audit_other_charge(tx, &payment, learnt.key, info).await?;
    events::record(tx, &payment.account_id, EventType::PaymentFailed, &payment.to_json()).await?;
    Ok((problem_answer(problem, &info.request_id, base), extra))
}
