//! `POST /v1/payments`: `started` → `payment_created` → finished. The first phase inserts the
//! payment with its PaymentIntent frozen; the second creates and confirms it at the processor (or
//! adopts what its webhook reported) and records the outcome with the stored answer: authorized,
//! refused, or waiting on the customer (`requires_action`, whose outcome arrives after the key is
//! finished: `crate::authentication`). The last phases' writes are in `record`.

use std::collections::BTreeMap;

use idem::{Claim, Engine, IdemError, Interrupted, Lease, Operation, Request};
use provider::{
    CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, IntentStatus, PaymentIntent,
    PaymentIntentRequest, ProcessorError,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::reconcile::{adopt_or_move_on, count_reconciliation, frozen_as, planned_call};
use super::reconcile::{refused_at_a_later_generation, report_extra};
use super::{Context, Learnt, LeaseInfo, PaymentOperation, internal};
use crate::authentication::AuthenticationSettings;
use crate::ids::{AccountId, PaymentId};
use crate::payments::{self, CaptureMethod, NewPayment, Payment, RowVersion};

mod fast_path;
mod lookups;
mod record;

use record::{Recorded, awaiting, charged, failed, refusal_of};

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

/// The PaymentIntent for the payment `payment_id` made of `request`, created and confirmed in one
/// call, frozen under its first key.
fn intent_request(
    payment_id: &PaymentId,
    request: &NewPayment,
    metadata: &BTreeMap<String, String>,
    authentication: &AuthenticationSettings,
) -> FrozenRequest {
    PaymentIntentRequest {
        payment_id: payment_id.to_string(),
        amount: request.amount.get(),
        currency: request.currency.to_string(),
        payment_method: request.payment_method.clone(),
        capture: request.capture_method == CaptureMethod::Automatic,
        description: request.description.clone(),
        metadata: metadata.clone(),
        return_url: authentication.return_url.to_string(),
    }
    .freeze(DownstreamKey::charge(payment_id))
}

/// What a PaymentIntent's confirmation came to, as the create records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Came {
    /// Authorized: captured (`succeeded`) or awaiting a capture (`requires_capture`).
    Authorized,
    /// The customer must authenticate: the answer is `requires_action`.
    NeedsAction,
    /// Declined (or canceled): no money moved.
    Refused,
    /// Not decided yet (`processing`, say): look again.
    Undecided,
}

impl Came {
    fn of(intent: &PaymentIntent) -> Self {
        match intent.status {
            IntentStatus::Succeeded | IntentStatus::RequiresCapture => Self::Authorized,
            IntentStatus::RequiresAction => Self::NeedsAction,
            _ if intent.is_decided() => Self::Refused,
            _ => Self::Undecided,
        }
    }
}

/// Counts a PaymentIntent adopted from the processor's webhook; the audit detail of its adoption.
fn pushed_adoption(intent_id: &str, key: &DownstreamKey) -> Value {
    count_reconciliation("charge", "adopted");
    json!({"outcome": "adopted", "cause": "webhook", "found": intent_id, "downstream_key": key.as_str()})
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
            // The payment, `processing`, with its audit record, and the PaymentIntent frozen at
            // `payment_created`. (On the fast path this phase ran in the claim, as one
            // statement: `fast_path::claim_with_payment`.)
            CreatePoint::Started => {
                let id = PaymentId::generate();
                let (account_id, request) = (&self.params.account_id, &self.params.request);
                let (metadata, authentication) =
                    (&self.ctx.charge_metadata, &self.ctx.authentication);
                let call = intent_request(&id, request, metadata, authentication);
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
                frozen_as(&request, "/v1/payment_intents")?;
                let Some(answered) = self.confirm(lease, at, &payment, &request).await? else {
                    // Nothing found at the processor: the call moved to its next generation.
                    return Ok(());
                };
                let learnt = Learnt { key: &request.key, reconciled: answered.reconciled.as_ref() };
                match answered.intent {
                    // A PaymentIntent found by reconciliation may be a declined one.
                    Ok(intent) if Came::of(&intent) == Came::Authorized => {
                        self.record_charge(lease, (&payment, version), &intent, learnt, &info)
                            .await?;
                    }
                    Ok(intent) if Came::of(&intent) == Came::NeedsAction => {
                        let settings = &self.ctx.authentication;
                        let mut tx = lease.begin().await?;
                        let answer =
                            awaiting(&mut tx, &payment, &intent, learnt, &info, settings).await?;
                        tx.commit_answer(answer).await?;
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

/// What the confirmation came to: the PaymentIntent (authorized, waiting on its customer, or
/// declined) or the processor's error, and what reconciliation or the processor's webhook found
/// when it answered for the call.
struct Answered {
    intent: Result<PaymentIntent, ProcessorError>,
    reconciled: Option<Value>,
}

impl<P: CardProcessor> CreatePayment<P> {
    /// Creates and confirms the frozen PaymentIntent `request` at the processor, unless its
    /// webhook told us already what the call made, and reconciles an answer that cannot tell.
    /// `None` when reconciliation found nothing and moved the call to its key's next generation.
    async fn confirm(
        &self,
        lease: &mut Lease,
        at: CreatePoint,
        payment: &Payment,
        request: &FrozenRequest,
    ) -> Result<Option<Answered>, Interrupted> {
        let adopted = |intent: PaymentIntent| {
            let reconciled = Some(pushed_adoption(&intent.id, &request.key));
            Ok(Some(Answered { intent: Ok(intent), reconciled }))
        };
        // A key's first run made no call under it before: nothing can have been pushed, unless
        // an earlier generation of the key was called.
        if (lease.attempts(), request.key.generation_number()) != (1, 1)
            && let Some(intent) = self.pushed_intent(payment, &request.key).await?
        {
            return adopted(intent);
        }
        idem::failpoint(|| format!("{CREATE_PAYMENT}.before_call")).await;
        let outcome = self.ctx.processor.create_payment_intent(request).await;
        idem::failpoint(|| format!("{CREATE_PAYMENT}.after_call")).await;
        let err = match outcome {
            Ok(intent) if Came::of(&intent) != Came::Undecided => {
                return Ok(Some(Answered { intent: Ok(intent), reconciled: None }));
            }
            Ok(undecided) => {
                let (intent, detail) = self.decided(lease, &request.key, undecided).await?;
                return Ok(Some(Answered { intent: Ok(intent), reconciled: Some(detail) }));
            }
            Err(err) => err,
        };
        match err.class() {
            // No answer: the processor's webhook may have told us meanwhile (it landed while
            // this lease was mid-call).
            ErrorClass::Transient | ErrorClass::UnknownOutcome => {
                match self.pushed_intent(payment, &request.key).await? {
                    Some(intent) => adopted(intent),
                    None => Ok(Some(Answered { intent: Err(err), reconciled: None })),
                }
            }
            ErrorClass::Reconcile => {
                let found = self.reconcile(lease, payment, &request.key, &err).await?;
                let subject = payment.reconciled();
                let adopted =
                    adopt_or_move_on(lease, at, request, subject, "charge", &err, found).await?;
                Ok(adopted.map(|(intent, detail)| Answered {
                    intent: Ok(intent),
                    reconciled: Some(detail),
                }))
            }
            ErrorClass::Final => {
                let intent = refused_at_a_later_generation(request, Err(err))?;
                Ok(Some(Answered { intent, reconciled: None }))
            }
        }
    }

    /// The last phase when the processor authorized the payment: [`charged`] in a fenced
    /// transaction, or, on the fast path, one statement when it can be
    /// (`fast_path::charged_in_one`).
    async fn record_charge(
        &self,
        lease: &mut Lease,
        (payment, version): (&Payment, Option<RowVersion>),
        intent: &PaymentIntent,
        learnt: Learnt<'_>,
        info: &LeaseInfo,
    ) -> Result<(), Interrupted> {
        if let Some(version) = version
            && self.ctx.fast_path
            && learnt.reconciled.is_none()
            && learnt.key.generation_number() == 1
        {
            let (row, batches) = ((payment, version), self.ctx.charged.as_ref());
            if fast_path::charged_in_one(batches, lease, row, intent, learnt.key, info).await? {
                return Ok(());
            }
        }
        let mut tx = lease.begin().await?;
        let (answer, extra) = charged(&mut tx, payment, intent, learnt, info).await?;
        tx.commit_answer(answer).await?;
        report_extra(&payment.id, extra.as_ref());
        Ok(())
    }
}
