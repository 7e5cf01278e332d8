//! `POST /v1/webhook_endpoints` with an `Idempotency-Key`, as an operation of one phase: the
//! endpoint registered with its secret, and the answer stored, in one transaction.

use std::sync::Arc;

use idem::{Interrupted, Lease, Operation, StoredResponse};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::{Context, PaymentOperation, problem_answer};
use crate::DomainError;
use crate::ids::AccountId;
use crate::problems::{Problem, ProblemCode};
use crate::webhooks::{EnabledEvents, SealingKeys, create, created_answer};

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

/// `POST /v1/webhook_endpoints` with an `Idempotency-Key`: one phase registers the endpoint and
/// stores the answer, so that a retry after a lost answer gets the same endpoint and its secret,
/// byte for byte, instead of registering a second one. The stored answer holds the secret sealed,
/// as the endpoint's row does (`webhooks::reveal_secret` opens it in the answer sent): it is kept
/// as long as the key (`idempotency.retention_hours`), as the contract's replays need, but never
/// in plain text, in the database or in the answers kept in memory.
#[derive(Debug)]
pub struct CreateEndpoint {
    public_base_url: Arc<str>,
    sealing_keys: Arc<SealingKeys>,
    params: CreateEndpointParams,
}

impl CreateEndpoint {
    /// The operation for input checked before the claim, sealing with `sealing_keys`.
    pub fn new(
        public_base_url: Arc<str>,
        sealing_keys: Arc<SealingKeys>,
        params: CreateEndpointParams,
    ) -> Self {
        Self { public_base_url, sealing_keys, params }
    }
}

impl<P> PaymentOperation<P> for CreateEndpoint {
    const NAME: &'static str = CREATE_ENDPOINT;
    type Params = CreateEndpointParams;

    fn with_params(ctx: &Context<P>, params: CreateEndpointParams) -> Self {
        Self::new(ctx.public_base_url.clone(), ctx.sealing_keys.clone(), params)
    }

    fn params(&self) -> &CreateEndpointParams {
        &self.params
    }
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
        let (base, keys) = (&self.public_base_url, &self.sealing_keys);
        let answer = insert_endpoint(&mut tx, keys, &self.params, &request_id, base).await?;
        tx.commit_answer(answer).await
    }
}

/// The one phase of an endpoint's creation: the endpoint with its sealed secret (or the account's
/// bound refusing it), and the answer.
async fn insert_endpoint(
    tx: &mut PgConnection,
    keys: &SealingKeys,
    params: &CreateEndpointParams,
    request_id: &str,
    base: &str,
) -> Result<StoredResponse, DomainError> {
    let CreateEndpointParams { account_id, url, enabled_events } = params;
    Ok(match create(tx, keys, account_id, url, enabled_events).await {
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
