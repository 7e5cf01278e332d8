//! `POST /v1/webhook_endpoints/{id}` with an `Idempotency-Key`, as an operation of one phase.

use idem::{Interrupted, Lease, Operation, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::{Endpoint, EndpointStatus, set_status};
use crate::DomainError;
use crate::ids::{AccountId, WebhookEndpointId};
use crate::operations::{one_phase_operation, problem_answer};
use crate::problems::{Problem, ProblemCode};
use crate::updates::UpdatePoint;

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
        let mut tx = lease.begin().await?;
        let base = &self.public_base_url;
        let answer = update_status(&mut tx, &self.params, &request_id, base).await?;
        tx.commit_answer(answer).await
    }
}

/// The one phase of an update: the endpoint's new status (or its absence), and the answer.
async fn update_status(
    tx: &mut PgConnection,
    params: &UpdateEndpointParams,
    request_id: &str,
    base: &str,
) -> Result<StoredResponse, DomainError> {
    let UpdateEndpointParams { account_id, endpoint_id, status } = params;
    Ok(match set_status(&mut *tx, account_id, endpoint_id, *status).await? {
        Some(endpoint) => updated_answer(&endpoint),
        // Deleted (for good): this key's answer.
        None => problem_answer(&missing_endpoint(endpoint_id), request_id, base),
    })
}
