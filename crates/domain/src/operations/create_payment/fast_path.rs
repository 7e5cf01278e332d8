//! The fast path of a new payment, beside the reference road of `mod.rs`: the same writes in
//! fewer round trips. Its first phase is one statement that also claims the key (a new payment
//! costs no read of its own), and its last phase, in the common case, is one statement
//! (`payments::update_fenced`) or a row of a batch of them (`payments::batch`). A reader can skip
//! this file: the e2e test `the_fast_path_and_the_reference_road_write_the_same` holds the two
//! roads to the same rows, events, audit records and stored answers.

use idem::batch::Batcher;
use idem::{
    ClaimArgs, Claimed, ClaimsInFirstPhase, FirstStatement, Lease, OneStatement, PhaseError, Step,
};
use provider::{CardProcessor, Charge, DownstreamKey};
use serde_json::Value;
use sqlx::PgConnection;

use super::{CreatePayment, CreatePaymentParams, CreatePoint, Recorded, charge_request};
use crate::DomainError;
use crate::audit::AuditEvent;
use crate::ids::PaymentId;
use crate::jobs::Work;
use crate::operations::reconcile::plan_of;
use crate::operations::{Context, LeaseInfo, payment_answer};
use crate::payments::{self, Payment, RowVersion, Written};

/// The last phase of a charged payment as one statement, when it can be: the first call of the
/// key's first generation answered (nothing reconciled, no other charge to look for), and the
/// payment's row is as the first phase left it (`version`). `false` when it did not run (the
/// row changed meanwhile: its description, say); the caller then runs the reference form.
pub(super) async fn charged_in_one<P>(
    ctx: &Context<P>,
    lease: &mut Lease,
    (payment, version): (&Payment, RowVersion),
    charge: &Charge,
    key: &DownstreamKey,
    info: &LeaseInfo,
) -> Result<bool, idem::Interrupted> {
    let in_one = ChargedInOne::new(payment, version, charge, key, info, ctx.charged.as_ref());
    match lease.phase_in_one(in_one).await {
        Ok(()) => Ok(true),
        Err(PhaseError::Operation(InOne::Moved)) => Ok(false),
        Err(err) => Err(err.into()),
    }
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
    pub(super) fn new<P>(
        params: &'a CreatePaymentParams,
        ctx: &Context<P>,
        request_id: &'a str,
    ) -> Self {
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
