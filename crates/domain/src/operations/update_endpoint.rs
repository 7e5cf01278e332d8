//! `POST /v1/webhook_endpoints/{id}` with an `Idempotency-Key`, as an operation of one phase: the
//! endpoint's new status, and the answer stored, in one transaction.

use idem::{Interrupted, Lease, Operation, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::problem_answer;
use crate::DomainError;
use crate::ids::{AccountId, WebhookEndpointId};
use crate::webhooks::{EndpointStatus, missing_endpoint, set_status, updated_answer};

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

recovery_points!(UpdateEndpointPoint { Started => "started" });

one_phase_operation! {
    /// `POST /v1/webhook_endpoints/{id}` with an `Idempotency-Key`: one phase sets the status and
    /// stores the answer, so that a retry after a lost answer replays it instead of setting the
    /// status again, which would undo a change someone made in between (a disable retried after
    /// another request enabled the endpoint would silence it again).
    UpdateEndpoint(UpdateEndpointParams) = UPDATE_ENDPOINT
}

impl Operation for UpdateEndpoint {
    type Point = UpdateEndpointPoint;

    async fn step(
        &mut self,
        lease: &mut Lease,
        at: UpdateEndpointPoint,
    ) -> Result<(), Interrupted> {
        let UpdateEndpointPoint::Started = at;
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
