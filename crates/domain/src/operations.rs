//! The money-moving operations, as state machines of recovery points on the idempotency engine.
//!
//! Each operation is one `idem::Operation`: a request runs it through the API's runner, and the
//! completer runs the very same code through [`resume`]. Every foreign call sits between two
//! phases. The phase before it freezes the call (`Step::Call`): path, every field and the
//! downstream key, derived from a record that phase committed, are stored with the key, and every
//! attempt, by any process and any release, sends exactly that ([`provider::FrozenRequest`]).
//!
//! | operation | recovery points | downstream key |
//! |---|---|---|
//! | create a payment | `started` → `payment_created` → finished | `pay_…/charge` |
//! | capture | `started` → `capture_started` → finished | `pay_…/capture` |
//! | cancel | `started` → `cancel_started` → finished | `pay_…/cancel` |
//! | refund | `started` → `refund_created` → finished | `re_…/refund` |
//!
//! The call's result and the final answer are committed in one phase, so a new payment costs
//! three transactions: the claim, the insert, and the result with the stored answer.
//!
//! When the processor cannot tell us what a call did (it refuses our retry as different, or
//! replays a failure it stored for the key), the operation reconciles: it looks the object up by
//! our id, adopts what it finds, moves to the key's next generation when a trustworthy lookup
//! finds nothing, and flags the key for a person otherwise. Never a guess, never a stored answer
//! built from such a reply.
//!
//! The processor also pushes what it did (its webhooks, [`crate::processor_events`]): a resumed
//! charge, or one whose call got no answer, first asks whether an event reported the charge its
//! downstream key made, and adopts it in its own fenced phase without calling or searching.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{
    Interrupted, Lease, Operation, PhaseError, RecoveryPoint, Step, StoredResponse, TransientKind,
    boxed,
};
use provider::{
    CardProcessor, Charge, ChargeRequest, DownstreamKey, ErrorClass, FrozenRequest, ProcessorError,
    ReconcileCause, RefundRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};

use crate::DomainError;
use crate::audit::{self, AuditEvent};
use crate::events::{self, EventType};
use crate::ids::new_id;
use crate::payments::{self, CaptureMethod, Changes, CreatePaymentRequest, Payment, PaymentStatus};
use crate::problems::{PROBLEM_JSON, Problem, ProblemCode};
use crate::processor_events;
use crate::refunds::{self, CreateRefundRequest, NewRefund, Refund};

/// The stored names of the operations.
pub const CREATE_PAYMENT: &str = "payments.create";
/// Capture of an authorized payment.
pub const CAPTURE_PAYMENT: &str = "payments.capture";
/// Cancel of an authorized payment.
pub const CANCEL_PAYMENT: &str = "payments.cancel";
/// Refund of a captured payment.
pub const CREATE_REFUND: &str = "refunds.create";

/// What every operation needs.
pub struct Context<P> {
    /// The database.
    pub pool: PgPool,
    /// The card processor.
    pub processor: Arc<P>,
    /// The base of problem `type` links in stored answers.
    pub public_base_url: Arc<str>,
    /// Further `metadata[…]` members for every new charge (`processor.charge_metadata`).
    pub charge_metadata: Arc<BTreeMap<String, String>>,
}

impl<P> Context<P> {
    /// A context with no further charge metadata.
    pub fn new(pool: PgPool, processor: Arc<P>, public_base_url: Arc<str>) -> Self {
        Self { pool, processor, public_base_url, charge_metadata: Arc::default() }
    }

    /// The same, with `metadata` sent with every new charge.
    pub fn with_charge_metadata(self, metadata: BTreeMap<String, String>) -> Self {
        Self { charge_metadata: Arc::new(metadata), ..self }
    }
}

impl<P> Clone for Context<P> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            processor: self.processor.clone(),
            public_base_url: self.public_base_url.clone(),
            charge_metadata: self.charge_metadata.clone(),
        }
    }
}

impl<P> std::fmt::Debug for Context<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("public_base_url", &self.public_base_url)
            .finish_non_exhaustive()
    }
}

impl From<DomainError> for PhaseError<DomainError> {
    fn from(err: DomainError) -> Self {
        match err {
            // Database errors go to the engine as such, so it can retry serialization failures.
            DomainError::Database(err) => PhaseError::Database(err),
            other => PhaseError::Operation(other),
        }
    }
}

fn internal(err: impl std::fmt::Display) -> Interrupted {
    Interrupted::Transient { kind: TransientKind::Internal, detail: err.to_string() }
}

/// A processor failure that is not an answer: the key stays at its recovery point.
fn unavailable(err: &ProcessorError) -> Interrupted {
    Interrupted::Transient { kind: TransientKind::Processor, detail: err.to_string() }
}

/// A payment as a stored answer, with its ETag (and `Location` when it was created).
pub fn payment_answer(status: u16, payment: &Payment, created: bool) -> StoredResponse {
    let body = payment.to_json();
    let etag = Payment::etag_of(&body);
    let answer = StoredResponse::json(status, body).with_header("etag", etag);
    if created {
        answer.with_header("location", format!("/v1/payments/{}", payment.id))
    } else {
        answer
    }
}

fn refund_answer(refund: &Refund) -> StoredResponse {
    StoredResponse::json(201, refund.to_json())
        .with_header("location", format!("/v1/refunds/{}", refund.id))
}

fn problem_answer(problem: &Problem, request_id: &str, public_base_url: &str) -> StoredResponse {
    StoredResponse {
        status: problem.code.status(),
        headers: vec![("content-type".into(), PROBLEM_JSON.into())],
        body: problem.render(request_id, public_base_url),
    }
}

/// The final answer for a processor error that is final; `None` for one that is not.
fn final_problem(err: &ProcessorError, payment_id: &str) -> Option<Problem> {
    match err {
        ProcessorError::Declined { decline_code, message, .. } => Some(
            Problem::new(ProblemCode::CardDeclined, message.clone())
                .with_extension("decline_code", decline_code.clone())
                .with_extension("payment_id", payment_id.to_owned()),
        ),
        ProcessorError::Invalid { param, message, .. } => {
            let problem = Problem::new(
                ProblemCode::InvalidRequest,
                format!("The card processor refused the request: {message}"),
            );
            Some(match param.as_deref() {
                Some("source") => problem.with_param("payment_method"),
                Some(other) => problem.with_param(other),
                None => problem,
            })
        }
        ProcessorError::Unavailable { .. }
        | ProcessorError::UnknownOutcome { .. }
        | ProcessorError::MustReconcile { .. } => None,
    }
}

fn failure_code(err: &ProcessorError) -> String {
    match err {
        ProcessorError::Declined { decline_code, .. } => decline_code.clone(),
        ProcessorError::Invalid { code, .. } => {
            code.clone().unwrap_or_else(|| "processor_invalid_request".into())
        }
        ProcessorError::Unavailable { .. }
        | ProcessorError::UnknownOutcome { .. }
        | ProcessorError::MustReconcile { .. } => "processor_error".into(),
    }
}

macro_rules! recovery_points {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        /// The recovery points of one operation.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $( #[doc = $text] $variant ),+ }

        impl RecoveryPoint for $name {
            fn name(self) -> &'static str {
                match self { $( Self::$variant => $text ),+ }
            }
            fn from_name(name: &str) -> Option<Self> {
                match name { $( $text => Some(Self::$variant), )+ _ => None }
            }
        }
    };
}

recovery_points!(CreatePoint { Started => "started", PaymentCreated => "payment_created" });
recovery_points!(CapturePoint { Started => "started", CaptureStarted => "capture_started" });
recovery_points!(CancelPoint { Started => "started", CancelStarted => "cancel_started" });
recovery_points!(RefundPoint { Started => "started", RefundCreated => "refund_created" });

async fn record(
    tx: &mut PgConnection,
    account_id: &str,
    object_id: &str,
    action: &str,
    lease: &LeaseInfo,
    detail: Value,
) -> Result<(), DomainError> {
    audit::record(tx, &lease.audit(account_id, object_id, action, detail)).await
}

/// What a phase needs to know of its lease, owned so that it can move into the phase's future.
#[derive(Debug, Clone)]
struct LeaseInfo {
    key_id: i64,
    request_id: String,
}

impl LeaseInfo {
    fn of(lease: &Lease) -> Self {
        Self { key_id: lease.key_id(), request_id: lease.request_id().to_owned() }
    }

    /// The audit record of `action` on `object_id`, made under this lease.
    fn audit<'a>(
        &'a self,
        account_id: &'a str,
        object_id: &'a str,
        action: &'a str,
        detail: Value,
    ) -> AuditEvent<'a> {
        AuditEvent {
            account_id,
            object_id,
            action,
            request_id: &self.request_id,
            idempotency_key_id: self.key_id,
            detail,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Frozen calls and reconciliation, shared by every operation.

/// A frozen request as the key stores it.
fn plan_of(request: &FrozenRequest) -> Value {
    serde_json::to_value(request).unwrap_or(Value::Null)
}

/// The call planned at the lease's recovery point, after the fenced check that this lease still
/// holds the key (a holder that lost it stops here, before calling). A key planned by a release
/// that did not freeze its calls has none: `plan_now` builds it from the local records, and it is
/// committed, fenced, before the first call this release makes.
async fn planned_call<P: RecoveryPoint>(
    lease: &mut Lease,
    at: P,
    plan_now: impl FnOnce() -> FrozenRequest,
) -> Result<FrozenRequest, Interrupted> {
    if let Some(plan) = lease.before_call().await? {
        return serde_json::from_value(plan).map_err(|err| Interrupted::NeedsHuman {
            reason: format!("the planned call does not parse: {err}"),
        });
    }
    let request = plan_now();
    let plan = plan_of(&request);
    lease
        .phase(|_tx| {
            let plan = plan.clone();
            boxed(async move { Ok::<_, PhaseError<DomainError>>(Step::Call(at, plan)) })
        })
        .await?;
    // Right after our own phase planned it: no further round trip.
    lease.before_call().await?;
    Ok(request)
}

/// What a lookup at the processor found for a call whose answer we cannot have.
enum Reconciled<T> {
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
async fn when_nothing_found<T>(
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

fn count_reconciliation(operation: &str, outcome: &'static str) {
    metrics::counter!("reconciliations_total", "object" => operation.to_owned(), "outcome" => outcome)
        .increment(1);
}

fn cause_name(err: &ProcessorError) -> &'static str {
    match err {
        ProcessorError::MustReconcile { cause: ReconcileCause::KeyReused, .. } => "key_reused",
        ProcessorError::MustReconcile { cause: ReconcileCause::ReplayedFailure(_), .. } => {
            "replayed_failure"
        }
        _ => "other",
    }
}

/// Moves the call at `at` to its key's next generation, recorded (fenced, with an audit record)
/// before the call is sent again, so that two generations are never in flight.
async fn next_generation<P: RecoveryPoint>(
    lease: &mut Lease,
    at: P,
    request: &FrozenRequest,
    (account_id, object_id, action): (&str, &str, &str),
    what: &str,
    cause: &ProcessorError,
) -> Result<(), Interrupted> {
    let next = request.next_generation();
    let plan = plan_of(&next);
    let info = LeaseInfo::of(lease);
    let detail = json!({
        "outcome": "next_generation", "cause": cause_name(cause),
        "previous_key": request.key.as_str(), "downstream_key": next.key.as_str(),
    });
    lease
        .phase(|tx| {
            let (plan, info, detail) = (plan.clone(), info.clone(), detail.clone());
            let (account_id, object_id, action) =
                (account_id.to_owned(), object_id.to_owned(), action.to_owned());
            boxed(async move {
                record(tx, &account_id, &object_id, &action, &info, detail).await?;
                Ok::<_, PhaseError<DomainError>>(Step::Call(at, plan))
            })
        })
        .await?;
    count_reconciliation(what, "next_generation");
    tracing::warn!(key_id = info.key_id, object_id, downstream_key = %next.key, "nothing found at the processor: calling again under the next key generation");
    Ok(())
}

/// A final refusal of a later generation (`…/2`) proves nothing about the earlier ones: the
/// lookup that let it go out may have missed what they did (a search that trailed further than
/// its documented lag), and a refusal stored now could stand behind a charge. A person looks.
fn refused_at_a_later_generation<T>(
    request: &FrozenRequest,
    outcome: Result<T, ProcessorError>,
) -> Result<Result<T, ProcessorError>, Interrupted> {
    match outcome {
        Err(err) if err.class() == ErrorClass::Final && request.key.generation_number() > 1 => {
            Err(Interrupted::NeedsHuman {
                reason: format!(
                    "{} was refused ({err}); what an earlier generation of the key did is not known for sure",
                    request.key
                ),
            })
        }
        other => Ok(other),
    }
}

/// A charge call's outcome: what the processor answered, or what its webhook told us before we
/// called.
enum ChargeOutcome {
    /// Told by the webhook: no call was made.
    Pushed(Charge),
    /// The call's answer.
    Called(Result<Charge, ProcessorError>),
}
use ChargeOutcome::{Called, Pushed};

/// The audit detail of a charge adopted from the processor's webhook.
fn adopted_pushed(charge_id: &str, key: &DownstreamKey) -> Value {
    json!({"outcome": "adopted", "cause": "webhook", "found": charge_id, "downstream_key": key.as_str()})
}

/// The audit detail of an adopted object.
fn adopted(cause: &ProcessorError, object: &str, key: &DownstreamKey) -> Value {
    json!({"outcome": "adopted", "cause": cause_name(cause), "found": object, "downstream_key": key.as_str()})
}

// ---------------------------------------------------------------------------------------------
// Create a payment.

/// The stored input of a payment creation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreatePaymentParams {
    /// The account.
    pub account_id: String,
    /// The validated request.
    pub request: CreatePaymentRequest,
}

/// `POST /v1/payments`.
#[derive(Debug)]
pub struct CreatePayment<P> {
    ctx: Context<P>,
    params: CreatePaymentParams,
    /// The payment the first phase made, so the next step need not read it back.
    created: Mutex<Option<Payment>>,
}

impl<P: CardProcessor> CreatePayment<P> {
    /// The operation for validated input.
    pub fn new(ctx: Context<P>, params: CreatePaymentParams) -> Self {
        Self { ctx, params, created: Mutex::new(None) }
    }

    async fn payment(&self, key_id: i64) -> Result<Payment, Interrupted> {
        if let Some(payment) =
            self.created.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
        {
            return Ok(payment);
        }
        payments::find_by_key(&self.ctx.pool, key_id)
            .await
            .map_err(internal)?
            .ok_or_else(|| internal("the key is past `payment_created` but has no payment"))
    }
}

/// The charge request for the payment `payment_id` made of `request`, frozen under its first key.
fn charge_request(
    payment_id: &str,
    request: &CreatePaymentRequest,
    metadata: &BTreeMap<String, String>,
) -> FrozenRequest {
    ChargeRequest {
        payment_id: payment_id.to_owned(),
        amount: request.amount,
        currency: request.currency.clone(),
        source: request.payment_method.clone(),
        capture: request.capture_method == CaptureMethod::Automatic,
        description: request.description.clone(),
        metadata: metadata.clone(),
    }
    .freeze(DownstreamKey::charge(payment_id))
}

impl<P: CardProcessor> CreatePayment<P> {
    /// The charge the processor's webhook says the call under `key` made, if one did
    /// (`processor_events`). A charge that is not this payment's is for a person, and so is a
    /// decline of a later generation, as when the call itself answers one
    /// ([`refused_at_a_later_generation`]).
    async fn pushed_charge(
        &self,
        payment: &Payment,
        key: &DownstreamKey,
    ) -> Result<Option<Charge>, Interrupted> {
        let found = processor_events::charge_for_key(&self.ctx.pool, key.as_str())
            .await
            .map_err(internal)?;
        match found {
            Some(charge)
                if charge.metadata.get("payment_id") != Some(&payment.id)
                    || charge.amount != payment.amount
                    || charge.currency != payment.currency =>
            {
                Err(Interrupted::NeedsHuman {
                    reason: format!(
                        "the processor reported {} ({} {}) under {key}, which does not match {}",
                        charge.id, charge.amount, charge.currency, payment.id
                    ),
                })
            }
            Some(charge) if !charge.paid && key.generation_number() > 1 => {
                Err(Interrupted::NeedsHuman {
                    reason: format!(
                        "{key} was declined ({}, reported by the processor's webhook); what an \
                         earlier generation of the key did is not known for sure",
                        charge.id
                    ),
                })
            }
            found => Ok(found),
        }
    }

    /// The processor cannot tell us what the charge request did: what its webhook told us, or
    /// else look for the payment's charge.
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
        let ours: Vec<Charge> = found
            .into_iter()
            .filter(|charge| charge.metadata.get("payment_id") == Some(&payment.id))
            .collect();
        let paid: Vec<&Charge> = ours.iter().filter(|charge| charge.paid).collect();
        match (paid.as_slice(), ours.first()) {
            ([charge], _) => Ok(Reconciled::Adopt((*charge).clone())),
            // Declined: no money moved, and the decline is the answer.
            ([], Some(failed)) => Ok(Reconciled::Adopt(failed.clone())),
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

impl<P: CardProcessor> Operation for CreatePayment<P> {
    type Point = CreatePoint;

    async fn step(&self, lease: &mut Lease, at: CreatePoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        match at {
            // One statement: the payment, its audit record and the key (new, it is stored here),
            // with the charge frozen at `payment_created`. The payment's id is made before, so
            // that the frozen charge can name it.
            CreatePoint::Started => {
                let id = new_id("pay");
                let params = &self.params;
                let request = charge_request(&id, &params.request, &self.ctx.charge_metadata);
                let step = Step::Call(CreatePoint::PaymentCreated, plan_of(&request));
                let payment = lease
                    .phase_in_one(step, |pool, fence| {
                        let (id, info, params) = (id.clone(), info.clone(), params.clone());
                        boxed(async move {
                            let (account, request) = (&params.account_id, &params.request);
                            let made = payments::insert_fenced(
                                pool,
                                &id,
                                account,
                                &info.request_id,
                                request,
                                fence,
                            )
                            .await?;
                            Ok::<_, PhaseError<DomainError>>(made)
                        })
                    })
                    .await?;
                *self.created.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(payment);
            }
            CreatePoint::PaymentCreated => {
                let payment = self.payment(info.key_id).await?;
                let metadata = &self.ctx.charge_metadata;
                let request = planned_call(lease, at, || {
                    charge_request(&payment.id, &self.params.request, metadata)
                })
                .await?;
                // A key's first run made no call under it before: nothing can have been pushed.
                let pushed = match lease.attempts() {
                    1 => None,
                    _ => self.pushed_charge(&payment, &request.key).await?,
                };
                let outcome = match pushed {
                    Some(charge) => Pushed(charge),
                    None => {
                        idem::failpoint(|| format!("{CREATE_PAYMENT}.before_call")).await;
                        let outcome = self.ctx.processor.create_charge(&request).await;
                        idem::failpoint(|| format!("{CREATE_PAYMENT}.after_call")).await;
                        Called(outcome)
                    }
                };
                let (outcome, reconciled) = match outcome {
                    Pushed(charge) => {
                        let detail = adopted_pushed(&charge.id, &request.key);
                        (Ok(charge), Some(detail))
                    }
                    // No answer: the processor's webhook may have told us meanwhile (it landed
                    // while this lease was mid-call).
                    Called(Err(err))
                        if matches!(
                            err.class(),
                            ErrorClass::Transient | ErrorClass::UnknownOutcome
                        ) =>
                    {
                        match self.pushed_charge(&payment, &request.key).await? {
                            Some(charge) => {
                                let detail = adopted_pushed(&charge.id, &request.key);
                                (Ok(charge), Some(detail))
                            }
                            None => (Err(err), None),
                        }
                    }
                    Called(Err(err)) if err.class() == ErrorClass::Reconcile => {
                        match self.reconcile(lease, &payment, &request.key, &err).await? {
                            Reconciled::Adopt(charge) => {
                                let detail = adopted(&err, &charge.id, &request.key);
                                (Ok(charge), Some(detail))
                            }
                            Reconciled::NextGeneration => {
                                let object = (
                                    payment.account_id.as_str(),
                                    payment.id.as_str(),
                                    "payment.reconciled",
                                );
                                return next_generation(
                                    lease, at, &request, object, "charge", &err,
                                )
                                .await;
                            }
                        }
                    }
                    Called(other) => (refused_at_a_later_generation(&request, other)?, None),
                };
                if reconciled.is_some() {
                    count_reconciliation("charge", "adopted");
                }
                let base = self.ctx.public_base_url.clone();
                let key = request.key.clone();
                match outcome {
                    // A charge found by reconciliation may be a declined one.
                    Ok(charge) if charge.paid => {
                        lease
                            .phase(|tx| {
                                let (payment, charge, info, key, reconciled) = (payment.clone(), charge.clone(), info.clone(), key.clone(), reconciled.clone());
                                boxed(async move {
                                    let status = if charge.captured { PaymentStatus::Succeeded } else { PaymentStatus::RequiresCapture };
                                    let changes = Changes {
                                        status: Some(status),
                                        amount_captured: Some(charge.amount_captured),
                                        processor_charge_id: Some(&charge.id),
                                        ..Changes::default()
                                    };
                                    if let Some(detail) = reconciled {
                                        record(tx, &payment.account_id, &payment.id, "payment.reconciled", &info, detail).await?;
                                    }
                                    let charged = info.audit(&payment.account_id, &payment.id, "payment.charged", json!({"charge": charge.id, "downstream_key": key.as_str(), "status": status}));
                                    let payment = payments::update(tx, &payment.id, &changes, Some(&charged)).await?;
                                    if let (PaymentStatus::Succeeded, Some(email)) = (payment.status, &payment.receipt_email) {
                                        audit::stage_job(tx, "receipt", &payment.id, json!({"payment_id": payment.id, "email": email})).await?;
                                    }
                                    events::record(tx, &payment.account_id, if charge.captured { EventType::PaymentSucceeded } else { EventType::PaymentRequiresCapture }, &payment.to_json()).await?;
                                    Ok::<_, PhaseError<DomainError>>(Step::<CreatePoint>::Finish(payment_answer(201, &payment, true)))
                                })
                            })
                            .await?;
                    }
                    declined => {
                        let err = match declined {
                            Ok(charge) => ProcessorError::Declined {
                                decline_code: charge
                                    .failure_code
                                    .clone()
                                    .unwrap_or_else(|| "generic_decline".to_owned()),
                                message: "Your card was declined.".to_owned(),
                                charge_id: Some(charge.id),
                            },
                            Err(err) => err,
                        };
                        let problem =
                            final_problem(&err, &payment.id).ok_or_else(|| unavailable(&err))?;
                        let charge_id = match &err {
                            ProcessorError::Declined { charge_id, .. } => charge_id.clone(),
                            _ => None,
                        };
                        let message = err.to_string();
                        lease
                            .phase(|tx| {
                                let (payment, info, problem, base, charge_id, message, reconciled) = (
                                    payment.clone(),
                                    info.clone(),
                                    problem.clone(),
                                    base.clone(),
                                    charge_id.clone(),
                                    message.clone(),
                                    reconciled.clone(),
                                );
                                let code = failure_code(&err);
                                boxed(async move {
                                    let changes = Changes {
                                        status: Some(PaymentStatus::Failed),
                                        processor_charge_id: charge_id.as_deref(),
                                        failure_code: Some(&code),
                                        failure_message: Some(&problem.detail),
                                        ..Changes::default()
                                    };
                                    if let Some(detail) = reconciled {
                                        record(tx, &payment.account_id, &payment.id, "payment.reconciled", &info, detail).await?;
                                    }
                                    let failed = info.audit(&payment.account_id, &payment.id, "payment.failed", json!({"error": message}));
                                    let payment = payments::update(tx, &payment.id, &changes, Some(&failed)).await?;
                                    events::record(tx, &payment.account_id, EventType::PaymentFailed, &payment.to_json()).await?;
                                    Ok::<_, PhaseError<DomainError>>(Step::<CreatePoint>::Finish(
                                        problem_answer(&problem, &info.request_id, &base),
                                    ))
                                })
                            })
                            .await?;
                    }
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Capture and cancel: lock the payment, mark it `processing` (so no other operation starts on
// it), call the processor, record the outcome.

/// The stored input of a capture.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureParams {
    /// The account.
    pub account_id: String,
    /// The payment.
    pub payment_id: String,
    /// Default: the whole authorized amount.
    pub amount_to_capture: Option<i64>,
}

/// Why a payment was canceled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancellationReason {
    /// A duplicate.
    Duplicate,
    /// Fraud.
    Fraudulent,
    /// The customer asked.
    RequestedByCustomer,
    /// Nobody completed it.
    Abandoned,
}

impl CancellationReason {
    fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
            Self::Abandoned => "abandoned",
        }
    }
}

/// The stored input of a cancel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelParams {
    /// The account.
    pub account_id: String,
    /// The payment.
    pub payment_id: String,
    /// Why.
    pub cancellation_reason: Option<CancellationReason>,
}

/// What the first phase of a capture or cancel decided.
enum Gate {
    /// The payment is now `processing`; go on. Its authorization, at the processor.
    Open {
        /// The payment.
        payment_id: String,
        /// The authorized charge.
        charge_id: String,
    },
    /// A final answer instead.
    Refused(Problem),
}

impl Gate {
    /// The phase's step: on to `next` with the call `plan` builds from the payment's id and its
    /// charge, frozen; or the refusal stored as the final answer.
    fn into_step<P>(
        self,
        next: P,
        plan: impl FnOnce(&str, &str) -> FrozenRequest,
        info: &LeaseInfo,
        public_base_url: &str,
    ) -> Step<P> {
        match self {
            Gate::Open { payment_id, charge_id } => {
                Step::Call(next, plan_of(&plan(&payment_id, &charge_id)))
            }
            Gate::Refused(problem) => {
                Step::Finish(problem_answer(&problem, &info.request_id, public_base_url))
            }
        }
    }
}

/// The capture of `charge_id`, frozen under the payment's capture key.
fn capture_request(payment_id: &str, charge_id: &str, amount: Option<i64>) -> FrozenRequest {
    FrozenRequest::capture(charge_id, amount, DownstreamKey::capture(payment_id))
}

/// The release of `charge_id`'s authorization, frozen under the payment's cancel key.
fn cancel_request(payment_id: &str, charge_id: &str) -> FrozenRequest {
    RefundRequest {
        charge_id: charge_id.to_owned(),
        payment_id: payment_id.to_owned(),
        refund_id: None,
        amount: None,
        reason: None,
    }
    .freeze(DownstreamKey::cancel(payment_id))
}

/// The authorized charge of a payment that awaits capture (or is being captured or canceled).
fn authorization(payment: &Payment) -> Result<&str, Interrupted> {
    payment
        .processor_charge_id
        .as_deref()
        .ok_or_else(|| internal("an authorized payment without a charge"))
}

/// Locks the payment; refuses unless it awaits capture; marks it `processing`.
async fn open_gate(
    tx: &mut PgConnection,
    account_id: &str,
    payment_id: &str,
    capture_amount: Option<i64>,
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
                payment.status.as_str()
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

async fn current_payment(
    pool: &PgPool,
    account_id: &str,
    payment_id: &str,
) -> Result<Payment, Interrupted> {
    payments::find(pool, account_id, payment_id)
        .await
        .map_err(internal)?
        .ok_or_else(|| internal("the payment vanished"))
}

/// `POST /v1/payments/{id}/capture`.
#[derive(Debug)]
pub struct CapturePayment<P> {
    ctx: Context<P>,
    params: CaptureParams,
}

impl<P: CardProcessor> CapturePayment<P> {
    /// The operation for validated input.
    pub fn new(ctx: Context<P>, params: CaptureParams) -> Self {
        Self { ctx, params }
    }
}

/// The processor cannot tell us what a capture or a release did: the charge itself says.
/// `done` decides from the charge whether the call acted; `undone` whether it surely did not
/// (and may be sent again under the next key); anything else needs a person.
async fn reconcile_authorization<P: CardProcessor>(
    ctx: &Context<P>,
    lease: &mut Lease,
    charge_id: &str,
    what: &str,
    done: impl Fn(&Charge) -> bool,
    undone: impl Fn(&Charge) -> bool,
) -> Result<Reconciled<Charge>, Interrupted> {
    lease.renew().await?;
    let charge = ctx.processor.retrieve_charge(charge_id).await.map_err(|err| unavailable(&err))?;
    if done(&charge) {
        Ok(Reconciled::Adopt(charge))
    } else if undone(&charge) {
        // A charge read is consistent: no lag, only the calls still in flight.
        when_nothing_found(lease, ctx.processor.longest_call(), Duration::ZERO, what).await
    } else {
        Err(Interrupted::NeedsHuman {
            reason: format!(
                "the {what} of {charge_id} cannot be reconciled: the charge is captured {} for {}, refunded {}",
                charge.captured, charge.amount_captured, charge.amount_refunded
            ),
        })
    }
}

impl<P: CardProcessor> Operation for CapturePayment<P> {
    type Point = CapturePoint;

    async fn step(&self, lease: &mut Lease, at: CapturePoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = self.ctx.public_base_url.clone();
        match at {
            CapturePoint::Started => {
                lease
                    .phase(|tx| {
                        let (params, info, base) =
                            (self.params.clone(), info.clone(), base.clone());
                        boxed(async move {
                            let gate = open_gate(
                                tx,
                                &params.account_id,
                                &params.payment_id,
                                params.amount_to_capture,
                                "captured",
                                &info,
                            )
                            .await?;
                            let plan = |payment: &str, charge: &str| {
                                capture_request(payment, charge, params.amount_to_capture)
                            };
                            Ok::<_, PhaseError<DomainError>>(gate.into_step(
                                CapturePoint::CaptureStarted,
                                plan,
                                &info,
                                &base,
                            ))
                        })
                    })
                    .await?;
            }
            CapturePoint::CaptureStarted => {
                let payment = current_payment(
                    &self.ctx.pool,
                    &self.params.account_id,
                    &self.params.payment_id,
                )
                .await?;
                let charge_id = authorization(&payment)?.to_owned();
                let amount = self.params.amount_to_capture;
                let request =
                    planned_call(lease, at, || capture_request(&payment.id, &charge_id, amount))
                        .await?;
                idem::failpoint(|| format!("{CAPTURE_PAYMENT}.before_call")).await;
                let outcome = match self.ctx.processor.capture_charge(&request).await {
                    // A capture that answers with an uncaptured charge did not say what it did.
                    Ok(charge) if !charge.captured => Err(ProcessorError::UnknownOutcome {
                        message: format!("the capture answered with {} uncaptured", charge.id),
                    }),
                    other => other,
                };
                idem::failpoint(|| format!("{CAPTURE_PAYMENT}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let found = reconcile_authorization(
                            &self.ctx,
                            lease,
                            &charge_id,
                            "capture",
                            |charge| charge.captured,
                            |charge| charge.paid && !charge.captured && charge.amount_refunded == 0,
                        )
                        .await?;
                        match found {
                            Reconciled::Adopt(charge) => {
                                count_reconciliation("capture", "adopted");
                                let detail = adopted(&err, &charge.id, &request.key);
                                (Ok(charge), Some(detail))
                            }
                            Reconciled::NextGeneration => {
                                let object = (
                                    payment.account_id.as_str(),
                                    payment.id.as_str(),
                                    "payment.reconciled",
                                );
                                return next_generation(
                                    lease, at, &request, object, "capture", &err,
                                )
                                .await;
                            }
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                let problem = match &outcome {
                    Ok(_) => None,
                    Err(err) => {
                        Some(final_problem(err, &payment.id).ok_or_else(|| unavailable(err))?)
                    }
                };
                let key = request.key.clone();
                lease
                    .phase(|tx| {
                        let (payment, info, base, problem, key, reconciled) = (payment.clone(), info.clone(), base.clone(), problem.clone(), key.clone(), reconciled.clone());
                        let captured = outcome.as_ref().ok().map(|c| c.amount_captured);
                        boxed(async move {
                            if let Some(detail) = reconciled {
                                record(tx, &payment.account_id, &payment.id, "payment.reconciled", &info, detail).await?;
                            }
                            let step = match (captured, problem) {
                                (Some(amount_captured), _) => {
                                    let changes = Changes { status: Some(PaymentStatus::Succeeded), amount_captured: Some(amount_captured), ..Changes::default() };
                                    let payment = payments::update(tx, &payment.id, &changes, None).await?;
                                    if let Some(email) = &payment.receipt_email {
                                        audit::stage_job(tx, "receipt", &payment.id, json!({"payment_id": payment.id, "email": email})).await?;
                                    }
                                    record(tx, &payment.account_id, &payment.id, "payment.captured", &info, json!({"amount_captured": amount_captured, "downstream_key": key.as_str()})).await?;
                                    events::record(tx, &payment.account_id, EventType::PaymentCaptured, &payment.to_json()).await?;
                                    Step::<CapturePoint>::Finish(payment_answer(200, &payment, false))
                                }
                                (None, problem) => {
                                    let problem = problem.unwrap_or_else(|| Problem::new(ProblemCode::InvalidRequest, "The card processor refused the capture."));
                                    Step::Finish(reopen(tx, &payment, &info, &problem, &base, "payment.capture_refused").await?)
                                }
                            };
                            Ok::<_, PhaseError<DomainError>>(step)
                        })
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

/// `POST /v1/payments/{id}/cancel`: releases the authorization at the processor.
#[derive(Debug)]
pub struct CancelPayment<P> {
    ctx: Context<P>,
    params: CancelParams,
}

impl<P: CardProcessor> CancelPayment<P> {
    /// The operation for validated input.
    pub fn new(ctx: Context<P>, params: CancelParams) -> Self {
        Self { ctx, params }
    }
}

impl<P: CardProcessor> Operation for CancelPayment<P> {
    type Point = CancelPoint;

    async fn step(&self, lease: &mut Lease, at: CancelPoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = self.ctx.public_base_url.clone();
        match at {
            CancelPoint::Started => {
                lease
                    .phase(|tx| {
                        let (params, info, base) =
                            (self.params.clone(), info.clone(), base.clone());
                        boxed(async move {
                            let gate = open_gate(
                                tx,
                                &params.account_id,
                                &params.payment_id,
                                None,
                                "canceled",
                                &info,
                            )
                            .await?;
                            Ok::<_, PhaseError<DomainError>>(gate.into_step(
                                CancelPoint::CancelStarted,
                                cancel_request,
                                &info,
                                &base,
                            ))
                        })
                    })
                    .await?;
            }
            CancelPoint::CancelStarted => {
                let payment = current_payment(
                    &self.ctx.pool,
                    &self.params.account_id,
                    &self.params.payment_id,
                )
                .await?;
                let charge_id = authorization(&payment)?.to_owned();
                let request =
                    planned_call(lease, at, || cancel_request(&payment.id, &charge_id)).await?;
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.before_call")).await;
                let outcome = self.ctx.processor.create_refund(&request).await.map(|_| ());
                idem::failpoint(|| format!("{CANCEL_PAYMENT}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        let found = reconcile_authorization(
                            &self.ctx,
                            lease,
                            &charge_id,
                            "cancel",
                            |charge| !charge.captured && charge.amount_refunded >= charge.amount,
                            |charge| charge.paid && !charge.captured && charge.amount_refunded == 0,
                        )
                        .await?;
                        match found {
                            Reconciled::Adopt(charge) => {
                                count_reconciliation("cancel", "adopted");
                                (Ok(()), Some(adopted(&err, &charge.id, &request.key)))
                            }
                            Reconciled::NextGeneration => {
                                let object = (
                                    payment.account_id.as_str(),
                                    payment.id.as_str(),
                                    "payment.reconciled",
                                );
                                return next_generation(
                                    lease, at, &request, object, "cancel", &err,
                                )
                                .await;
                            }
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                let problem = match &outcome {
                    Ok(()) => None,
                    Err(err) => {
                        Some(final_problem(err, &payment.id).ok_or_else(|| unavailable(err))?)
                    }
                };
                let reason = self.params.cancellation_reason.map(CancellationReason::as_str);
                let key = request.key.clone();
                lease
                    .phase(|tx| {
                        let (payment, info, base, problem, key, reconciled) = (
                            payment.clone(),
                            info.clone(),
                            base.clone(),
                            problem.clone(),
                            key.clone(),
                            reconciled.clone(),
                        );
                        boxed(async move {
                            if let Some(detail) = reconciled {
                                record(
                                    tx,
                                    &payment.account_id,
                                    &payment.id,
                                    "payment.reconciled",
                                    &info,
                                    detail,
                                )
                                .await?;
                            }
                            let step = match problem {
                                None => {
                                    let changes = Changes {
                                        status: Some(PaymentStatus::Canceled),
                                        cancellation_reason: reason,
                                        ..Changes::default()
                                    };
                                    let payment =
                                        payments::update(tx, &payment.id, &changes, None).await?;
                                    record(
                                        tx,
                                        &payment.account_id,
                                        &payment.id,
                                        "payment.canceled",
                                        &info,
                                        json!({"downstream_key": key.as_str()}),
                                    )
                                    .await?;
                                    events::record(
                                        tx,
                                        &payment.account_id,
                                        EventType::PaymentCanceled,
                                        &payment.to_json(),
                                    )
                                    .await?;
                                    Step::<CancelPoint>::Finish(payment_answer(
                                        200, &payment, false,
                                    ))
                                }
                                Some(problem) => Step::Finish(
                                    reopen(
                                        tx,
                                        &payment,
                                        &info,
                                        &problem,
                                        &base,
                                        "payment.cancel_refused",
                                    )
                                    .await?,
                                ),
                            };
                            Ok::<_, PhaseError<DomainError>>(step)
                        })
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Refunds: the first phase locks the payment and reserves the amount, so concurrent refunds under
// different keys can never exceed what was captured, here or at the processor.

/// The stored input of a refund.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefundParams {
    /// The account.
    pub account_id: String,
    /// The payment.
    pub payment_id: String,
    /// The validated request.
    pub request: CreateRefundRequest,
}

/// `POST /v1/payments/{id}/refunds`.
#[derive(Debug)]
pub struct CreateRefundOp<P> {
    ctx: Context<P>,
    params: RefundParams,
}

impl<P: CardProcessor> CreateRefundOp<P> {
    /// The operation for validated input.
    pub fn new(ctx: Context<P>, params: RefundParams) -> Self {
        Self { ctx, params }
    }
}

/// The refund `refund` of `charge_id`, frozen under the refund's key.
fn refund_request(refund: &Refund, charge_id: &str) -> FrozenRequest {
    RefundRequest {
        charge_id: charge_id.to_owned(),
        payment_id: refund.payment_id.clone(),
        refund_id: Some(refund.id.clone()),
        amount: Some(refund.amount),
        reason: refund.reason.clone(),
    }
    .freeze(DownstreamKey::refund(&refund.id))
}

impl<P: CardProcessor> CreateRefundOp<P> {
    /// The processor cannot tell us what the refund request did: the charge's refunds say (a
    /// list, consistent at once).
    async fn reconcile(
        &self,
        lease: &mut Lease,
        refund: &Refund,
        charge_id: &str,
    ) -> Result<Reconciled<provider::Refund>, Interrupted> {
        lease.renew().await?;
        let found =
            self.ctx.processor.list_refunds(charge_id).await.map_err(|err| unavailable(&err))?;
        let mut ours: Vec<provider::Refund> = found
            .into_iter()
            .filter(|found| found.metadata.get("refund_id") == Some(&refund.id))
            .collect();
        match ours.len() {
            0 => {
                when_nothing_found(
                    lease,
                    self.ctx.processor.longest_call(),
                    Duration::ZERO,
                    "refund",
                )
                .await
            }
            1 => Ok(Reconciled::Adopt(ours.remove(0))),
            n => Err(Interrupted::NeedsHuman {
                reason: format!("{n} refunds at the processor for {}", refund.id),
            }),
        }
    }
}

impl<P: CardProcessor> Operation for CreateRefundOp<P> {
    type Point = RefundPoint;

    async fn step(&self, lease: &mut Lease, at: RefundPoint) -> Result<(), Interrupted> {
        let info = LeaseInfo::of(lease);
        let base = self.ctx.public_base_url.clone();
        match at {
            RefundPoint::Started => {
                lease
                    .phase(|tx| {
                        let (params, info, base) = (self.params.clone(), info.clone(), base.clone());
                        boxed(async move {
                            let payment = payments::lock(tx, &params.account_id, &params.payment_id).await?.ok_or(DomainError::NotFound("payment"))?;
                            let refusal = |problem: Problem| Ok::<_, PhaseError<DomainError>>(Step::Finish(problem_answer(&problem, &info.request_id, &base)));
                            if payment.status != PaymentStatus::Succeeded {
                                return refusal(Problem::new(
                                    ProblemCode::PaymentUnexpectedState,
                                    format!("The payment is `{}`; only a captured (`succeeded`) payment can be refunded.", payment.status.as_str()),
                                ));
                            }
                            let remaining = payment.amount_captured - payment.amount_refunded;
                            let amount = params.request.amount.unwrap_or(remaining);
                            if remaining == 0 || amount > remaining {
                                return refusal(
                                    Problem::new(
                                        ProblemCode::AmountTooLarge,
                                        format!("The refund of {amount} is more than what remains refundable ({remaining})."),
                                    )
                                    .with_param("amount"),
                                );
                            }
                            payments::update(tx, &payment.id, &Changes { refunded_delta: amount, ..Changes::default() }, None).await?;
                            let id = new_id("re");
                            let metadata: BTreeMap<String, String> = params.request.metadata.clone().unwrap_or_default();
                            let refund = refunds::insert(tx, &NewRefund {
                                id: &id,
                                account_id: &params.account_id,
                                payment_id: &payment.id,
                                key_id: info.key_id,
                                amount,
                                currency: &payment.currency,
                                reason: params.request.reason,
                                metadata: &metadata,
                            })
                            .await?;
                            record(tx, &params.account_id, &refund.id, "refund.created", &info, json!({"payment": payment.id, "amount": amount})).await?;
                            let charge_id = payment.processor_charge_id.as_deref().ok_or(DomainError::Corrupt("a captured payment without a charge"))?;
                            Ok(Step::Call(RefundPoint::RefundCreated, plan_of(&refund_request(&refund, charge_id))))
                        })
                    })
                    .await?;
            }
            RefundPoint::RefundCreated => {
                let refund = refunds::find_by_key(&self.ctx.pool, info.key_id)
                    .await
                    .map_err(internal)?
                    .ok_or_else(|| {
                        internal("the key is past `refund_created` but has no refund")
                    })?;
                let payment =
                    current_payment(&self.ctx.pool, &self.params.account_id, &refund.payment_id)
                        .await?;
                let charge_id = payment
                    .processor_charge_id
                    .clone()
                    .ok_or_else(|| internal("a captured payment without a charge"))?;
                let request =
                    planned_call(lease, at, || refund_request(&refund, &charge_id)).await?;
                idem::failpoint(|| format!("{CREATE_REFUND}.before_call")).await;
                let outcome = self.ctx.processor.create_refund(&request).await;
                idem::failpoint(|| format!("{CREATE_REFUND}.after_call")).await;
                let (outcome, reconciled) = match outcome {
                    Err(err) if err.class() == ErrorClass::Reconcile => {
                        match self.reconcile(lease, &refund, &charge_id).await? {
                            Reconciled::Adopt(found) => {
                                count_reconciliation("refund", "adopted");
                                let detail = adopted(&err, &found.id, &request.key);
                                (Ok(found), Some(detail))
                            }
                            Reconciled::NextGeneration => {
                                let object = (
                                    refund.account_id.as_str(),
                                    refund.id.as_str(),
                                    "refund.reconciled",
                                );
                                return next_generation(
                                    lease, at, &request, object, "refund", &err,
                                )
                                .await;
                            }
                        }
                    }
                    other => (refused_at_a_later_generation(&request, other)?, None),
                };
                // Stripe answers a refund that is still on its way (`pending`,
                // `requires_action`) or that did not go through after all (`failed`,
                // `canceled`) with a 200 too: only `succeeded` says the money moved back. Any
                // other status is neither a success nor a refusal this code may record, so a
                // person looks (the amount stays reserved against the payment meanwhile).
                if let Ok(found) = &outcome
                    && found.status != "succeeded"
                {
                    return Err(Interrupted::NeedsHuman {
                        reason: format!(
                            "the processor answered refund {} of {charge_id} with status `{}`, not `succeeded`",
                            found.id, found.status
                        ),
                    });
                }
                let key = request.key.clone();
                let problem = match &outcome {
                    Ok(_) => None,
                    Err(err) => Some((
                        final_problem(err, &payment.id).ok_or_else(|| unavailable(err))?,
                        failure_code(err),
                    )),
                };
                let processor_refund_id = outcome.as_ref().ok().map(|r| r.id.clone());
                lease
                    .phase(|tx| {
                        let (refund, info, base, problem, key, processor_refund_id, reconciled) = (refund.clone(), info.clone(), base.clone(), problem.clone(), key.clone(), processor_refund_id.clone(), reconciled.clone());
                        boxed(async move {
                            if let Some(detail) = reconciled {
                                record(tx, &refund.account_id, &refund.id, "refund.reconciled", &info, detail).await?;
                            }
                            let step = match problem {
                                None => {
                                    let refund = refunds::settle(tx, &refund.id, processor_refund_id.as_deref(), None).await?;
                                    record(tx, &refund.account_id, &refund.id, "refund.succeeded", &info, json!({"processor_refund": processor_refund_id, "downstream_key": key.as_str()})).await?;
                                    events::record(tx, &refund.account_id, EventType::RefundSucceeded, &refund.to_json()).await?;
                                    Step::<RefundPoint>::Finish(refund_answer(&refund))
                                }
                                Some((problem, code)) => {
                                    // Give the reservation back: the money did not move.
                                    let failed = refunds::settle(tx, &refund.id, None, Some(&code)).await?;
                                    payments::update(tx, &refund.payment_id, &Changes { refunded_delta: -refund.amount, ..Changes::default() }, None).await?;
                                    record(tx, &refund.account_id, &refund.id, "refund.failed", &info, json!({"detail": problem.detail})).await?;
                                    events::record(tx, &refund.account_id, EventType::RefundFailed, &failed.to_json()).await?;
                                    Step::Finish(problem_answer(&problem, &info.request_id, &base))
                                }
                            };
                            Ok::<_, PhaseError<DomainError>>(step)
                        })
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

/// Resumes any operation from its key, as the completer does: the operation is chosen by the
/// name stored with the key, its input read from the stored parameters. A key this code cannot
/// resume (an unknown operation, parameters that do not parse) never will be by retrying: it is
/// flagged for a person, not left leased.
pub async fn resume<P: CardProcessor>(
    ctx: &Context<P>,
    lease: Lease,
) -> Result<StoredResponse, Interrupted> {
    fn params<T: serde::de::DeserializeOwned>(lease: &Lease) -> Result<T, String> {
        serde_json::from_value(lease.params().clone())
            .map_err(|err| format!("stored parameters do not parse: {err}"))
    }
    let unresumable = match lease.operation() {
        CREATE_PAYMENT => match params(&lease) {
            Ok(params) => {
                return idem::drive(&CreatePayment::new(ctx.clone(), params), lease).await;
            }
            Err(reason) => reason,
        },
        CAPTURE_PAYMENT => match params(&lease) {
            Ok(params) => {
                return idem::drive(&CapturePayment::new(ctx.clone(), params), lease).await;
            }
            Err(reason) => reason,
        },
        CANCEL_PAYMENT => match params(&lease) {
            Ok(params) => {
                return idem::drive(&CancelPayment::new(ctx.clone(), params), lease).await;
            }
            Err(reason) => reason,
        },
        crate::updates::UPDATE_PAYMENT => match params(&lease) {
            Ok(params) => {
                let update =
                    crate::updates::UpdatePayment::new(ctx.public_base_url.clone(), params);
                return idem::drive(&update, lease).await;
            }
            Err(reason) => reason,
        },
        crate::webhooks::CREATE_ENDPOINT => match params(&lease) {
            Ok(params) => {
                let create =
                    crate::webhooks::CreateEndpoint::new(ctx.public_base_url.clone(), params);
                return idem::drive(&create, lease).await;
            }
            Err(reason) => reason,
        },
        CREATE_REFUND => match params(&lease) {
            Ok(params) => {
                return idem::drive(&CreateRefundOp::new(ctx.clone(), params), lease).await;
            }
            Err(reason) => reason,
        },
        other => format!("unknown operation `{other}`"),
    };
    lease.flag(&unresumable).await;
    Err(Interrupted::NeedsHuman { reason: unresumable })
}
