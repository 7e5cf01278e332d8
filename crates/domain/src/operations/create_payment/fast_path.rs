//! The fast path of a new payment, beside the reference road of `mod.rs`: the same writes in
//! fewer round trips. Its first phase is one statement that also claims the key
//! ([`claim_with_payment`]: a new payment costs no read of its own), and its last phase, in the
//! common case, is one statement (`payments::update_fenced`) or a row of a batch of them
//! (`payments::batch`) ([`charged_in_one`]). A reader can skip this file: the e2e test
//! `the_fast_path_and_the_reference_road_write_the_same` holds the two roads to the same rows,
//! events, audit records and stored answers.

use idem::{Claim, Engine, IdemError, Lease, PhaseError, Request, Step};
use provider::{CardProcessor, DownstreamKey, PaymentIntent};

use super::{CreatePayment, CreatePoint, Recorded, intent_request};
use crate::DomainError;
use crate::ids::PaymentId;
use crate::operations::reconcile::plan_of;
use crate::operations::{LeaseInfo, payment_answer};
use crate::payments::{self, Payment, RowVersion, Written};

/// Claims the key of a new payment with its first phase, as one statement: the payment, its audit
/// record and the key (new, it is stored here, claimed with it), with the PaymentIntent frozen at
/// `payment_created` (`payments::insert_claiming`). The payment's id is made before, so that the
/// frozen request can name it. The payment made is kept for the next step.
pub(super) async fn claim_with_payment<P: CardProcessor>(
    operation: &mut CreatePayment<P>,
    engine: &Engine,
    request: &Request,
) -> Result<Claim, IdemError> {
    let id = PaymentId::generate();
    let (params, ctx) = (&operation.params, &operation.ctx);
    let (metadata, authentication) = (&ctx.charge_metadata, &ctx.authentication);
    let plan = plan_of(&intent_request(&id, &params.request, metadata, authentication));
    let step = Step::Call(CreatePoint::PaymentCreated, plan);
    let (account, new, request_id) = (&params.account_id, &params.request, &*request.request_id);
    let (claim, created) = engine
        .claim_first(request, step, async |connection, claim| {
            Ok(payments::insert_claiming(connection, &id, account, request_id, new, claim).await?)
        })
        .await?;
    operation.created = created;
    Ok(claim)
}

/// The last phase of an authorized payment as one statement, when it can be: the first call of
/// the key's first generation answered (nothing reconciled, no other charge to look for), and the
/// payment's row is as the first phase left it (`version`). It writes what `charged` writes,
/// with the answer computed before, from the row at `version` ([`Changes::apply`]), as a row of
/// the batch of new payments' last phases (`payments::batch`) when there is one, else alone
/// (`payments::update_fenced`). `false` when it did not run (the row changed meanwhile: its
/// description, say; or its statement waited [`idem::ONE_STATEMENT_TIMEOUT`] for a lock); the
/// caller then runs the reference form.
///
/// [`Changes::apply`]: crate::payments::Changes::apply
pub(super) async fn charged_in_one(
    batches: Option<&idem::batch::Batcher<payments::batch::Charged>>,
    lease: &mut Lease,
    (payment, version): (&Payment, RowVersion),
    intent: &PaymentIntent,
    key: &DownstreamKey,
    info: &LeaseInfo,
) -> Result<bool, idem::Interrupted> {
    let recorded = Recorded::of(payment, intent, key);
    let audit = recorded.audit(payment, info);
    let charged = recorded.changes.apply(payment);
    let (receipt, object) = (Recorded::receipt(&charged), charged.to_json());
    let written =
        Written { audit: &audit, job: receipt.as_ref(), event: (recorded.event, &object) };
    let (id, changes) = (&payment.id, &recorded.changes);
    let step = Step::<CreatePoint>::Finish(payment_answer(201, &charged, true));
    if let Some(batches) = batches
        && let Some(row) = payments::batch::ChargedRow::new(id, version, changes, &written)
        && lease.phase_in_batch(&step, batches, row).await?
    {
        return Ok(true);
    }
    let sent = lease
        .phase_in_one(step, async |connection, fence| {
            match payments::update_fenced(connection, id, version, changes, &written, fence).await {
                Ok(Some(key_id)) => Ok((key_id, ())),
                Ok(None) => Err(PhaseError::Operation(InOne::Moved)),
                Err(DomainError::Database(err)) => Err(PhaseError::Database(err)),
                Err(other) => Err(PhaseError::Operation(InOne::Failed(other))),
            }
        })
        .await;
    match sent {
        Ok(()) => Ok(true),
        Err(PhaseError::Operation(InOne::Moved)) => Ok(false),
        // It waited (for the payment's row lock, say) and wrote nothing: the reference form
        // holds the key from its first statement, so it may wait past the lease untaken.
        Err(err) if err.timed_out() => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Why the last phase did not run as one statement.
#[derive(Debug, thiserror::Error)]
enum InOne {
    /// The payment's row changed since the first phase: nothing was written, and the fence was
    /// not called.
    #[error("the payment changed since the first phase")]
    Moved,
    #[error(transparent)]
    Failed(DomainError),
}
