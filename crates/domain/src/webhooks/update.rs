//! `POST /v1/webhook_endpoints/{id}` with an `Idempotency-Key`, as an operation of one phase.

use idem::{Interrupted, Lease, Operation, Phase, PhaseError, Step, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::{Endpoint, EndpointStatus, set_status};
use crate::DomainError;
use crate::ids::{AccountId, WebhookEndpointId};
use crate::operations::one_phase_operation;
use crate::problems::{Problem, ProblemCode};
use crate::updates::{UpdatePoint, problem_answer};

/// The stored name of a keyed endpoint update, for the completer.
pub const UPDATE_ENDPOINT: &str = "webhook_endpoints.update";

/// The stored input of a keyed `POST /v1/webhook_endpoints/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateEndpointParams {
    /// The account.
    pub account_id: AccountId,
    /// The endpoint.
    pub endpoint_id: WebhookEndpointId,
    /// The status the request sets.
    pub status: EndpointStatus,
}

one_phase_operation! {
    /// `POST /v1/webhook_endpoints/{id}` with an `Idempotency-Key`: one phase sets the status and
    /// stores the answer, so that a retry after a lost answer replays it instead of setting the
    /// status again, which would undo a change someone made in between (a disable retried after
    /// another request enabled the endpoint would silence it again).
    UpdateEndpoint(UpdateEndpointParams) = UPDATE_ENDPOINT
}

/// The answer to an update: `200` and the endpoint, without its secret.
pub fn updated_answer(endpoint: &Endpoint) -> StoredResponse {
    let body = endpoint.to_value(false).to_string().into_bytes();
    StoredResponse::json(200, body)
}

/// The problem an unknown (or deleted) endpoint answers.
pub fn missing_endpoint(id: &str) -> Problem {
    Problem::new(ProblemCode::ResourceMissing, format!("No such webhook endpoint: '{id}'."))
        .with_param("id")
}

impl Operation for UpdateEndpoint {
    type Point = UpdatePoint;

    async fn step(&mut self, lease: &mut Lease, at: UpdatePoint) -> Result<(), Interrupted> {
        let UpdatePoint::Started = at;
        let request_id = lease.request_id().to_owned();
        let (params, base) = (&self.params, &self.public_base_url);
        lease.phase(SetStatus { params, request_id: &request_id, base }).await?;
        Ok(())
    }
}

/// The one phase of an update: the endpoint's new status (or its absence), and the answer.
struct SetStatus<'a> {
    params: &'a UpdateEndpointParams,
    request_id: &'a str,
    base: &'a str,
}

impl Phase for SetStatus<'_> {
    type Point = UpdatePoint;
    type Error = DomainError;

    async fn run(
        &mut self,
        tx: &mut PgConnection,
    ) -> Result<Step<UpdatePoint>, PhaseError<DomainError>> {
        let UpdateEndpointParams { account_id, endpoint_id, status } = self.params;
        let answer = match set_status(&mut *tx, account_id, endpoint_id, *status).await? {
            Some(endpoint) => updated_answer(&endpoint),
            // Deleted (for good): this key's answer.
            None => problem_answer(&missing_endpoint(endpoint_id), self.request_id, self.base),
        };
        Ok(Step::Finish(answer))
    }
}
