//! `POST /v1/webhook_endpoints` with an `Idempotency-Key`, as an operation of one phase: the
//! endpoint registered with its secret, and the answer stored, in one transaction.

use idem::{Interrupted, Lease, Operation, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::problem_answer;
use crate::DomainError;
use crate::ids::AccountId;
use crate::problems::{Problem, ProblemCode};
use crate::webhooks::{EnabledEvents, create, created_answer};

/// The stored name of a keyed endpoint creation, for the completer.
pub const CREATE_ENDPOINT: &str = "webhook_endpoints.create";

/// The stored input of a keyed `POST /v1/webhook_endpoints`, checked before the claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateEndpointParams {
    /// The account.
    pub account_id: AccountId,
    /// The URL, as [`AddressRule::check_url`](crate::webhooks::AddressRule::check_url) accepted it.
    pub url: url::Url,
    /// The types delivered.
    pub enabled_events: EnabledEvents,
}

recovery_points!(CreateEndpointPoint { Started => "started" });

one_phase_operation! {
    /// `POST /v1/webhook_endpoints` with an `Idempotency-Key`: one phase registers the endpoint
    /// and stores the answer, so that a retry after a lost answer gets the same endpoint and its
    /// secret, byte for byte, instead of registering a second one. The stored answer holds the
    /// secret, as the endpoint's row does (the worker signs with it, so neither can be a digest);
    /// it lives as long as the key (`idempotency.retention_hours`), and the inspector never shows
    /// it.
    CreateEndpoint(CreateEndpointParams) = CREATE_ENDPOINT
}

impl Operation for CreateEndpoint {
    type Point = CreateEndpointPoint;

    async fn step(
        &mut self,
        lease: &mut Lease,
        at: CreateEndpointPoint,
    ) -> Result<(), Interrupted> {
        let CreateEndpointPoint::Started = at;
        let request_id = lease.request_id().to_owned();
        let mut tx = lease.begin().await?;
        let base = &self.public_base_url;
        let answer = insert_endpoint(&mut tx, &self.params, &request_id, base).await?;
        tx.commit_answer(answer).await
    }
}

/// The one phase of an endpoint's creation: the endpoint with its secret (or the account's bound
/// refusing it), and the answer.
async fn insert_endpoint(
    tx: &mut PgConnection,
    params: &CreateEndpointParams,
    request_id: &str,
    base: &str,
) -> Result<StoredResponse, DomainError> {
    Ok(match create(tx, &params.account_id, &params.url, &params.enabled_events).await {
        Ok(endpoint) => created_answer(&endpoint),
        // The account's bound: this key's answer.
        Err(DomainError::Invalid { param, message }) => problem_answer(
            &Problem::new(ProblemCode::InvalidRequest, message).with_param(param),
            request_id,
            base,
        ),
        Err(err) => return Err(err),
    })
}
