//! `POST /v1/webhook_endpoints` with an `Idempotency-Key`, as an operation of one phase.

use idem::{Interrupted, Lease, Operation, Phase, PhaseError, Step, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::{EnabledEvents, Endpoint, create};
use crate::DomainError;
use crate::ids::AccountId;
use crate::operations::one_phase_operation;
use crate::problems::{Problem, ProblemCode};
use crate::updates::{UpdatePoint, problem_answer};

/// The stored name of a keyed endpoint creation, for the completer.
pub const CREATE_ENDPOINT: &str = "webhook_endpoints.create";

/// The stored input of a keyed `POST /v1/webhook_endpoints`, checked before the claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateEndpointParams {
    /// The account.
    pub account_id: AccountId,
    /// The URL, as [`AddressRule::check_url`](super::AddressRule::check_url) accepted it.
    pub url: url::Url,
    /// The types delivered.
    pub enabled_events: EnabledEvents,
}

one_phase_operation! {
    /// `POST /v1/webhook_endpoints` with an `Idempotency-Key`: one phase registers the endpoint
    /// and stores the answer, so that a retry after a lost answer gets the same endpoint and its
    /// secret, byte for byte, instead of registering a second one. The stored answer holds the
    /// secret, as the endpoint's row does (the worker signs with it, so neither can be a digest);
    /// it lives as long as the key (`idempotency.retention_hours`), and the inspector never shows
    /// it.
    CreateEndpoint(CreateEndpointParams) = CREATE_ENDPOINT
}

/// The answer to a creation: `201`, the endpoint with its secret, and its `Location`.
pub fn created_answer(endpoint: &Endpoint) -> StoredResponse {
    let body = endpoint.to_value(true).to_string().into_bytes();
    StoredResponse::json(201, body)
        .with_header("location", format!("/v1/webhook_endpoints/{}", endpoint.id))
}

impl Operation for CreateEndpoint {
    type Point = UpdatePoint;

    async fn step(&mut self, lease: &mut Lease, at: UpdatePoint) -> Result<(), Interrupted> {
        let UpdatePoint::Started = at;
        let request_id = lease.request_id().to_owned();
        let (account_id, base) = (&self.params.account_id, &self.public_base_url);
        let insert = InsertEndpoint {
            account_id,
            url: &self.params.url,
            enabled: &self.params.enabled_events,
            request_id: &request_id,
            base,
        };
        lease.phase(insert).await?;
        Ok(())
    }
}

/// The one phase of an endpoint's creation: the endpoint with its secret (or the account's bound
/// refusing it), and the answer.
struct InsertEndpoint<'a> {
    account_id: &'a AccountId,
    url: &'a url::Url,
    enabled: &'a EnabledEvents,
    request_id: &'a str,
    base: &'a str,
}

impl Phase for InsertEndpoint<'_> {
    type Point = UpdatePoint;
    type Error = DomainError;

    async fn run(
        &mut self,
        tx: &mut PgConnection,
    ) -> Result<Step<UpdatePoint>, PhaseError<DomainError>> {
        let answer = match create(tx, self.account_id, self.url, self.enabled).await {
            Ok(endpoint) => created_answer(&endpoint),
            // The account's bound: this key's answer.
            Err(DomainError::Invalid { param, message }) => problem_answer(
                &Problem::new(ProblemCode::InvalidRequest, message).with_param(param),
                self.request_id,
                self.base,
            ),
            Err(err) => return Err(PhaseError::from(err)),
        };
        Ok(Step::Finish(answer))
    }
}
