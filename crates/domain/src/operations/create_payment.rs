//! `POST /v1/payments`: `started` → `payment_created` → finished. The first phase inserts the
//! payment with the charge frozen; the second calls the processor (or adopts what its webhook
//! reported) and records the outcome with the stored answer.

use std::collections::BTreeMap;

use idem::batch::Batcher;
use idem::{
    ClaimArgs, Claimed, ClaimsInFirstPhase, FirstStatement, Interrupted, Lease, OneStatement,
    Operation, PhaseError, Step, StoredResponse,
};
use provider::{
    CardProcessor, Charge, ChargeRequest, DownstreamKey, ErrorClass, FrozenRequest, ProcessorError,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::reconcile::{
    Reconciled, adopt_or_move_on, audit_other_charge, count_reconciliation, plan_of, planned_call,
    refusal_may_be_stored, refused_at_a_later_generation, report_extra, when_nothing_found,
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
    self, CaptureMethod, Changes, NewPayment, Payment, PaymentStatus, RowVersion, Written,
};
use crate::processor_events::{self, ExtraCharge};

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

impl<P: CardProcessor> CreatePayment<P> {
    /// The charge the processor's webhook says the call under `key` made, if one did
    /// (`processor_events`). A charge that is not this payment's is for a person, and so is a
    /// decline of a later generation, as when the call itself answers one
    /// ([`refusal_may_be_stored`]).
    async fn pushed_charge(
        &self,
        payment: &Payment,
        key: &DownstreamKey,
    ) -> Result<Option<Charge>, Interrupted> {
        // A later generation is called only once lookups trusted that the earlier ones made
        // nothing. A webhook saying otherwise means one charge may already exist, and the call
        // under this key would make another: not for an automatic retry to decide.
        if key.generation_number() > 1
            && let Some((charge_id, earlier)) =
                processor_events::paid_under_another_key(&self.ctx.pool, &payment.id, key.as_str())
                    .await
                    .map_err(internal)?
        {
            return Err(Interrupted::NeedsHuman {
                reason: format!(
                    "the processor reported {charge_id} for {} under {earlier}, an earlier \
                     generation than {key}: a charge may already exist",
                    payment.id
                ),
            });
        }
        let found = processor_events::charge_for_key(&self.ctx.pool, key.as_str())
            .await
            .map_err(internal)?;
        match found {
            Some(charge)
                if !is_of(&charge, &payment.id)
                    || charge.amount != payment.amount.get()
                    || payment.currency != charge.currency =>
            {
                Err(Interrupted::NeedsHuman {
                    reason: format!(
                        "the processor reported {} ({} {}) under {key}, which does not match {}",
                        charge.id, charge.amount, charge.currency, payment.id
                    ),
                })
            }
            Some(charge) if !charge.paid => {
                refusal_may_be_stored(key, || {
                    format!("declined ({}, reported by the processor's webhook)", charge.id)
                })?;
                Ok(Some(charge))
            }
            found => Ok(found),
        }
    }

    /// The processor cannot tell us what the charge request did: what its webhook told us, or
    /// else look for the payment's charge. A declined charge found is the answer only where a
    /// decline the call answered would be ([`refusal_may_be_stored`]): under a later generation
    /// the search may not show yet an earlier generation's successful charge.
    async fn reconcile(
        &self,
        lease: &mut Lease,
        payment: &Payment,
        key: &DownstreamKey,
        why: &ProcessorError,
    ) -> Result<Reconciled<Charge>, Interrupted> {
        if let Some(charge) = self.pushed_charge(payment, key).await? {
            return Ok(Reconciled::Adopt(charge));
        }
        lease.renew().await?;
        let found = self
            .ctx
            .processor
            .search_charges(&payment.id)
            .await
            .map_err(|err| unavailable(&err))?;
        let ours: Vec<Charge> =
            found.into_iter().filter(|charge| is_of(charge, &payment.id)).collect();
        let paid: Vec<&Charge> = ours.iter().filter(|charge| charge.paid).collect();
        match (paid.as_slice(), ours.first()) {
            ([charge], _) => Ok(Reconciled::Adopt((*charge).clone())),
            // Declined: no money moved, and the decline is the answer (under the first
            // generation: under a later one, an earlier call may have charged the card).
            ([], Some(failed)) => {
                refusal_may_be_stored(key, || {
                    format!("declined ({}, found by the processor's search; {why})", failed.id)
                })?;
                Ok(Reconciled::Adopt(failed.clone()))
            }
            ([], None) => {
                let processor = &self.ctx.processor;
                when_nothing_found(
                    lease,
                    processor.longest_call(),
                    processor.search_lag(),
                    "charge",
                )
                .await
            }
            (several, _) => Err(Interrupted::NeedsHuman {
                reason: format!(
                    "{} successful charges at the processor for {} ({why})",
                    several.len(),
                    payment.id
                ),
            }),
        }
    }
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
            // One statement: the payment, its audit record and the key (new, it is stored here),
            // with the charge frozen at `payment_created`. For a key claimed with it, this phase
            // ran in the claim (`ClaimsInFirstPhase`); here it runs for a key the lease holds.
            CreatePoint::Started => {
                let insert = InsertPayment::new(&self.params, &self.ctx, &info.request_id);
                self.created = Some(lease.phase_first(insert).await?);
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
            Ok(charge) => return Ok(Some(Answered { charge: Ok(charge), reconciled: None })),
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
                let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
                let adopted =
                    adopt_or_move_on(lease, at, request, object, "charge", &err, found).await?;
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

    /// The last phase when the processor charged the card. The common case goes as one statement
    /// (`fast_path`): the first call of the key's first generation answered, and the payment's
    /// row is as the first phase left it. Otherwise, and when the row changed meanwhile (its
    /// description, say), the reference form: [`charged`] in a fenced transaction.
    async fn record_charge(
        &self,
        lease: &mut Lease,
        (payment, version): (&Payment, Option<RowVersion>),
        charge: &Charge,
        learnt: Learnt<'_>,
        info: &LeaseInfo,
    ) -> Result<(), Interrupted> {
        if let Some(version) = version
            && learnt.reconciled.is_none()
            && learnt.key.generation_number() == 1
        {
            let batches = self.ctx.charged.as_ref();
            let in_one = ChargedInOne::new(payment, version, charge, learnt.key, info, batches);
            match lease.phase_in_one(in_one).await {
                Ok(()) => return Ok(()),
                Err(PhaseError::Operation(InOne::Moved)) => {}
                Err(err) => return Err(err.into()),
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
        },
        Err(err) => err,
    };
    let problem = final_problem(&err, &payment.id).ok_or_else(|| unavailable(&err))?;
    Ok(Refused { err, problem })
}

/// The first phase, as one statement: the payment, its audit record and the key (new, it is
/// stored here, claimed with it), with the charge frozen at `payment_created`. The payment's id is
/// made before, so that the frozen charge can name it.
#[derive(Debug)]
pub struct InsertPayment<'a> {
    id: PaymentId,
    params: &'a CreatePaymentParams,
    request_id: &'a str,
    /// The charge, frozen.
    plan: Value,
}

impl<'a> InsertPayment<'a> {
    fn new<P>(params: &'a CreatePaymentParams, ctx: &Context<P>, request_id: &'a str) -> Self {
        let id = PaymentId::generate();
        let plan = plan_of(&charge_request(&id, &params.request, &ctx.charge_metadata));
        Self { id, params, request_id, plan }
    }
}

impl FirstStatement for InsertPayment<'_> {
    type Point = CreatePoint;
    type Error = DomainError;
    type Output = (Payment, RowVersion);

    fn step(&self) -> Step<CreatePoint> {
        Step::Call(CreatePoint::PaymentCreated, self.plan.clone())
    }

    async fn run(
        &mut self,
        connection: &mut PgConnection,
        claim: ClaimArgs<'_>,
    ) -> Result<(Claimed, Option<(Payment, RowVersion)>), PhaseError<DomainError>> {
        let (account, request) = (&self.params.account_id, &self.params.request);
        let id = &self.id;
        Ok(payments::insert_claiming(connection, id, account, self.request_id, request, claim)
            .await?)
    }
}

impl<P: CardProcessor> ClaimsInFirstPhase for CreatePayment<P> {
    type FirstOutput = (Payment, RowVersion);
    type FirstError = DomainError;
    type First<'a>
        = InsertPayment<'a>
    where
        Self: 'a;

    fn first<'a>(&'a mut self, request_id: &'a str) -> InsertPayment<'a> {
        InsertPayment::new(&self.params, &self.ctx, request_id)
    }

    fn ran_first(&mut self, output: (Payment, RowVersion)) {
        self.created = Some(output);
    }
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
    let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
    record_reconciled(tx, object, info, learnt.reconciled).await?;
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

/// Why the second phase did not run as one statement.
#[derive(Debug, thiserror::Error)]
enum InOne {
    /// The payment's row changed since the first phase: nothing was written.
    #[error("the payment changed since the first phase")]
    Moved,
    #[error(transparent)]
    Failed(DomainError),
}

/// The second phase when the processor charged the card, as one statement
/// (`payments::update_fenced`): `Charged` without its round trips. It needs the payment's row as
/// the first phase wrote it (the answer is computed before the statement, with
/// [`Changes::apply`]), and nothing to look up: the call was the key's first generation, so
/// there is no other charge to look for (`audit_other_charge`), and no reconciliation to record.
struct ChargedInOne<'a> {
    payment: &'a Payment,
    version: RowVersion,
    recorded: Recorded<'a>,
    audit: AuditEvent<'a>,
    /// The payment as the statement leaves it.
    charged: Payment,
    /// The batches the statement goes in, if it does.
    batches: Option<&'a Batcher<payments::batch::Charged>>,
}

impl<'a> ChargedInOne<'a> {
    fn new(
        payment: &'a Payment,
        version: RowVersion,
        charge: &'a Charge,
        key: &DownstreamKey,
        info: &'a LeaseInfo,
        batches: Option<&'a Batcher<payments::batch::Charged>>,
    ) -> Self {
        let recorded = Recorded::of(charge, key);
        let audit = recorded.audit(payment, info);
        let charged = recorded.changes.apply(payment);
        Self { payment, version, recorded, audit, charged, batches }
    }
}

impl ChargedInOne<'_> {
    /// What the statement writes beside the payment's changes: its audit record, its receipt
    /// (`Recorded::receipt` of the payment as charged) and its event (`object`, the payment's
    /// representation as charged).
    fn written<'w>(&'w self, receipt: Option<&'w Work>, object: &'w [u8]) -> Written<'w> {
        Written { audit: &self.audit, job: receipt, event: (self.recorded.event, object) }
    }
}

impl OneStatement for ChargedInOne<'_> {
    type Point = CreatePoint;
    type Error = InOne;
    type Output = ();

    fn step(&self) -> Step<CreatePoint> {
        Step::Finish(payment_answer(201, &self.charged, true))
    }

    async fn run(
        &mut self,
        connection: &mut PgConnection,
        fence: &idem::FenceRecord,
    ) -> Result<(i64, ()), PhaseError<InOne>> {
        let (receipt, object) = (Recorded::receipt(&self.charged), self.charged.to_json());
        let written = self.written(receipt.as_ref(), &object);
        let (id, version, changes) = (&self.payment.id, self.version, &self.recorded.changes);
        match payments::update_fenced(connection, id, version, changes, &written, fence).await {
            Ok(Some(key_id)) => Ok((key_id, ())),
            Ok(None) => Err(PhaseError::Operation(InOne::Moved)),
            Err(DomainError::Database(err)) => Err(PhaseError::Database(err)),
            Err(other) => Err(PhaseError::Operation(InOne::Failed(other))),
        }
    }

    /// The same writes as a row of the batches of new payments' last phases. A row the batch did
    /// not write (it failed, or the payment moved on) goes alone, through `run`.
    async fn run_batched(&mut self, fence: &idem::FenceRecord) -> Option<(i64, ())> {
        let batches = self.batches?;
        let (receipt, object) = (Recorded::receipt(&self.charged), self.charged.to_json());
        let written = self.written(receipt.as_ref(), &object);
        let (id, version, changes) = (&self.payment.id, self.version, &self.recorded.changes);
        let row = payments::batch::ChargedRow::new(id, version, changes, &written)?;
        batches.send(row, fence).await.map(|key_id| (key_id, ()))
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
    let object = (&*payment.account_id, &*payment.id, "payment.reconciled");
    record_reconciled(tx, object, info, learnt.reconciled).await?;
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
