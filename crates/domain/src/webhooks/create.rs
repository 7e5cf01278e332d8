//! `POST /v1/webhook_endpoints` with an `Idempotency-Key`, as an operation of one phase.

use idem::{Interrupted, Lease, Operation, PhaseError, Step, StoredResponse, boxed};
use serde::{Deserialize, Serialize};

use super::{EnabledEvents, Endpoint, create};
use crate::DomainError;
use crate::ids::AccountId;
use crate::operations::{Context, PaymentOperation};
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

/// `POST /v1/webhook_endpoints` with an `Idempotency-Key`: one phase registers the endpoint and
/// stores the answer, so that a retry after a lost answer gets the same endpoint and its secret,
/// byte for byte, instead of registering a second one. The stored answer holds the secret, as the
/// endpoint's row does (the worker signs with it, so neither can be a digest); it lives as long
/// as the key (`idempotency.retention_hours`), and the inspector never shows it.
#[derive(Debug)]
pub struct CreateEndpoint {
    public_base_url: std::sync::Arc<str>,
    params: CreateEndpointParams,
}

impl CreateEndpoint {
    /// The operation for input checked before the claim.
    pub fn new(public_base_url: std::sync::Arc<str>, params: CreateEndpointParams) -> Self {
        Self { public_base_url, params }
    }
}

/// The answer to a creation: `201`, the endpoint with its secret, and its `Location`.
pub fn created_answer(endpoint: &Endpoint) -> StoredResponse {
    let body = serde_json::to_vec(&endpoint.to_value(true)).unwrap_or_default();
    StoredResponse::json(201, body)
        .with_header("location", format!("/v1/webhook_endpoints/{}", endpoint.id))
}

impl<P> PaymentOperation<P> for CreateEndpoint {
    const NAME: &'static str = CREATE_ENDPOINT;
    type Params = CreateEndpointParams;

    fn with_params(ctx: &Context<P>, params: CreateEndpointParams) -> Self {
        Self::new(ctx.public_base_url.clone(), params)
    }

    fn params(&self) -> &CreateEndpointParams {
        &self.params
    }
}

impl Operation for CreateEndpoint {
    type Point = UpdatePoint;

    async fn step(&self, lease: &mut Lease, at: UpdatePoint) -> Result<(), Interrupted> {
        let UpdatePoint::Started = at;
        let (url, enabled) = (&self.params.url, &self.params.enabled_events);
        let request_id = lease.request_id().to_owned();
        lease
            .phase(|tx| {
                let (account_id, url, enabled) =
                    (self.params.account_id.clone(), url.clone(), enabled.clone());
                let (request_id, base) = (request_id.clone(), self.public_base_url.clone());
                boxed(async move {
                    let answer = match create(tx, &account_id, &url, &enabled).await {
                        Ok(endpoint) => created_answer(&endpoint),
                        // The account's bound: this key's answer.
                        Err(DomainError::Invalid { param, message }) => problem_answer(
                            &Problem::new(ProblemCode::InvalidRequest, message).with_param(param),
                            &request_id,
                            &base,
                        ),
                        Err(err) => return Err(PhaseError::from(err)),
                    };
                    Ok::<_, PhaseError<DomainError>>(Step::<UpdatePoint>::Finish(answer))
                })
            })
            .await?;
        Ok(())
    }
}
