//! `PATCH /v1/payments/{id}` with an `Idempotency-Key`: an operation of one phase, which applies
//! the merge patch (`payments::patch`) and stores the answer, so that a retry replays it.

use idem::{Interrupted, Lease, Operation, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::{payment_answer, problem_answer};
use crate::DomainError;
use crate::ids::{AccountId, PaymentId};
use crate::payments::{Patched, PaymentPatch, apply, missing_problem, stale_problem};
use crate::problems::{Problem, ProblemCode};

/// The stored name of the operation, for the completer.
pub const UPDATE_PAYMENT: &str = "payments.update";

recovery_points!(UpdatePaymentPoint { Started => "started" });

/// The stored input of a keyed PATCH.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateParams {
    /// The account.
    pub account_id: AccountId,
    /// The payment.
    pub payment_id: PaymentId,
    /// The merge patch (validated before the claim).
    pub patch: PaymentPatch,
    /// `If-Match`, when sent: checked under the payment's lock, in the phase.
    pub if_match: Option<String>,
}

one_phase_operation! {
    /// `PATCH /v1/payments/{id}` with an `Idempotency-Key`.
    UpdatePayment(UpdateParams) = UPDATE_PAYMENT
}

impl Operation for UpdatePayment {
    type Point = UpdatePaymentPoint;

    async fn step(&mut self, lease: &mut Lease, at: UpdatePaymentPoint) -> Result<(), Interrupted> {
        let UpdatePaymentPoint::Started = at;
        let request_id = lease.request_id().to_owned();
        let mut tx = lease.begin().await?;
        let answer = apply_patch(&mut tx, &self.params, &request_id, &self.public_base_url).await?;
        tx.commit_answer(answer).await
    }
}

/// The one phase of an update: the patch applied to the payment (or refused), and the answer.
async fn apply_patch(
    tx: &mut PgConnection,
    params: &UpdateParams,
    request_id: &str,
    base: &str,
) -> Result<StoredResponse, DomainError> {
    let (account_id, payment_id) = (&params.account_id, &params.payment_id);
    let if_match = params.if_match.as_deref();
    Ok(match apply(tx, account_id, payment_id, &params.patch, if_match).await {
        Ok(Patched::Updated(payment)) => payment_answer(200, &payment, false),
        Ok(Patched::Missing) => problem_answer(&missing_problem(payment_id), request_id, base),
        Ok(Patched::Stale { current_etag }) => {
            problem_answer(&stale_problem(&current_etag), request_id, base)
        }
        // A rule broken only by the merge (too many pairs) is this key's answer.
        Err(DomainError::Invalid { param, message }) => problem_answer(
            &Problem::new(ProblemCode::InvalidRequest, message).with_param(param),
            request_id,
            base,
        ),
        Err(err) => return Err(err),
    })
}
