//! `/v1/webhook_endpoints`: where the account's events are delivered, and each endpoint's
//! delivery log.
//!
//! The URL is held to the address rule (`payments_domain::webhooks::AddressRule`): `http` or
//! `https`, no address that is not globally reachable (loopback allowed by
//! `webhooks.allow_loopback`) or that `webhooks.deny_ranges` refuses. The signing secret is in
//! the creation's answer only, and kept sealed everywhere else (`webhooks::SealingKeys`): in the
//! endpoint's row and in the creation's stored answer, which this module opens as it sends it.
//! The delivery log shows each attempt's coarse outcome
//! (`payments_domain::webhooks::Failure`), never an error's text or its timing.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use payments_domain::DomainError;
use payments_domain::ids::WebhookEndpointId;
use payments_domain::operations::{
    CreateEndpoint, CreateEndpointParams, UpdateEndpoint, UpdateEndpointParams,
};
use payments_domain::webhooks::{
    self, AddressRule, EnabledEvents, EndpointStatus, Failure, Outcome,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::Authenticated;
use crate::error::ApiError;
use crate::extract::{ApiPath, JsonBody};
use crate::idempotency::{Keyed, OptionalKey, RequestMeta, stored_response};
use crate::openapi::{ApiKey, ApiRouter, CREATED, OK, Problems, WebhookEndpointList, code, param};

/// This module's routes: each handler's path and method are in its `#[utoipa::path]`.
pub fn routes(api: ApiRouter) -> ApiRouter {
    api.routes(routes!(list, create))
        .routes(routes!(retrieve, update, delete))
        .routes(routes!(attempts))
}

/// The most attempts the delivery log shows.
const LOG_LIMIT: i64 = 100;

/// `POST /v1/webhook_endpoints`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhookEndpointRequest {
    /// Where deliveries are posted: an `http` or `https` URL of a public address.
    pub url: String,
    /// The event types delivered, or `["*"]` for every type.
    pub enabled_events: Vec<String>,
}

/// `POST /v1/webhook_endpoints/{id}`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWebhookEndpointRequest {
    /// `true` stops deliveries (those that fall due while it is disabled are dropped); `false`
    /// resumes them, also for an endpoint the worker paused or disabled because it kept failing
    /// (its record of failures starts afresh).
    pub disabled: bool,
}

/// A webhook endpoint as the API shows it (the document's `WebhookEndpoint`). Its `Debug` leaves
/// the secret out.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = WebhookEndpoint)]
pub struct WebhookEndpointDoc {
    /// `we_…`
    pub id: String,
    /// Always `"webhook_endpoint"`.
    pub object: String,
    /// Where deliveries are posted.
    pub url: String,
    /// The event types delivered, or `["*"]`.
    pub enabled_events: Vec<String>,
    /// `enabled` or `disabled`.
    pub status: String,
    /// Unix seconds.
    pub created: i64,
    /// `whsec_…`: in the answer to the creation only. Verify each delivery's
    /// `Payments-Signature` with it.
    pub secret: Option<String>,
}

impl std::fmt::Debug for WebhookEndpointDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookEndpointDoc")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// One attempt of an endpoint's delivery log (the document's `WebhookAttempt`). Only a coarse
/// outcome is shown, never the error's text nor how long the attempt took: the account chooses
/// the URL, and those would let its deliveries map hosts and ports.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = WebhookAttempt)]
pub struct WebhookAttemptDoc {
    /// Always `"webhook_attempt"`.
    pub object: String,
    /// The event delivered, `evt_…`.
    pub event: String,
    /// 1 for the first attempt.
    pub attempt: i32,
    /// The receiver's status, when it answered.
    pub status_code: Option<i32>,
    /// Why the attempt failed, when it did (`http_status`: see `status_code`).
    pub error: Option<Failure>,
    /// What became of the delivery after this attempt.
    pub outcome: Outcome,
    /// Unix seconds.
    pub created: i64,
}

/// `GET /v1/webhook_endpoints/{id}/attempts` (the document's `WebhookAttemptList`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = WebhookAttemptList)]
pub struct WebhookAttemptListDoc {
    /// Always `"list"`.
    pub object: String,
    /// The latest attempts, newest first.
    pub data: Vec<WebhookAttemptDoc>,
    /// Always `false`: the log shows the latest 100 attempts only.
    pub has_more: bool,
    /// `/v1/webhook_endpoints/{id}/attempts`
    pub url: String,
}

fn no_such_endpoint(id: &str) -> ApiError {
    ApiError::from_problem(webhooks::missing_endpoint(id))
}

/// The endpoint a path names, if the path holds an endpoint's id; else the 404 for it.
fn endpoint_id(path: &str) -> Result<WebhookEndpointId, ApiError> {
    WebhookEndpointId::parse(path).map_err(|_| no_such_endpoint(path))
}

fn rule(state: &AppState) -> AddressRule {
    let webhooks = &state.settings.webhooks;
    AddressRule {
        allow_loopback: webhooks.allow_loopback,
        deny_ranges: webhooks.deny_ranges.ranges().to_vec(),
    }
}

/// `POST /v1/webhook_endpoints`. With an `Idempotency-Key`, the creation runs as a one-phase
/// operation and its answer (the secret included) is stored and replayed byte for byte, so a
/// retry after a lost answer finds the endpoint it made; without one, each request registers an
/// endpoint.
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints",
    operation_id = "createWebhookEndpoint",
    tag = "webhooks",
    summary = "Register a webhook endpoint; the answer carries its signing secret, once",
    params(param::CreationKey),
    request_body(content = CreateWebhookEndpointRequest, content_type = "application/json"),
    responses(
        (status = 201, description = CREATED, body = WebhookEndpointDoc,
            headers(("Location"), ("Idempotent-Replayed"))),
        Problems<ApiKey, (
            code::IdempotencyKeyInvalid,
            code::IdempotencyKeyInUse,
            code::IdempotencyKeyReused,
            code::InvalidRequest,
            code::PayloadTooLarge,
            code::UnsupportedMediaType,
        )>,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    meta: RequestMeta,
    OptionalKey(key): OptionalKey,
    body: JsonBody<CreateWebhookEndpointRequest>,
) -> Result<Response, ApiError> {
    // Refusals before the claim store nothing for the key.
    let url = rule(&state).check_url(&body.value.url)?;
    let enabled_events = EnabledEvents::parse(&body.value.enabled_events)?;
    let keys = &state.operations.sealing_keys;
    let Some(key) = key else {
        let mut conn = state.pool.acquire().await?;
        let endpoint = webhooks::create(&mut conn, keys, &account, &url, &enabled_events).await?;
        let sent = webhooks::reveal_secret(webhooks::created_answer(&endpoint), keys);
        return Ok(stored_response(sent.map_err(DomainError::from)?, false));
    };
    let params = CreateEndpointParams { account_id: account.clone(), url, enabled_events };
    let base = state.operations.public_base_url.clone();
    let operation = CreateEndpoint::new(base, keys.clone(), params);
    let keyed = Keyed { account: &account, credential: None, key: &key, meta: &meta, body: &body };
    // Stored (and kept in memory) with the secret sealed; opened here, in the first answer and in
    // every replay alike.
    let (stored, replayed) = keyed.answer(&state, operation).await?;
    let sent = webhooks::reveal_secret(stored, keys).map_err(DomainError::from)?;
    Ok(stored_response(sent, replayed))
}

/// `GET /v1/webhook_endpoints`
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints",
    operation_id = "listWebhookEndpoints",
    tag = "webhooks",
    summary = "List the account's webhook endpoints",
    responses((status = 200, description = OK, body = WebhookEndpointList), Problems<ApiKey>)
)]
pub async fn list(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
) -> Result<Json<serde_json::Value>, ApiError> {
    let endpoints = webhooks::list(&state.pool, &account).await?;
    let data: Vec<_> = endpoints.iter().map(|e| e.to_value(false)).collect();
    Ok(Json(json!({
        "object": "list", "data": data, "has_more": false, "url": "/v1/webhook_endpoints"
    })))
}

/// `GET /v1/webhook_endpoints/{id}`
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints/{id}",
    operation_id = "retrieveWebhookEndpoint",
    tag = "webhooks",
    summary = "Retrieve a webhook endpoint (without its secret)",
    params(param::EndpointId),
    responses(
        (status = 200, description = OK, body = WebhookEndpointDoc),
        Problems<ApiKey, (code::ResourceMissing,)>,
    )
)]
pub async fn retrieve(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(path): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = endpoint_id(&path)?;
    let endpoint =
        webhooks::find(&state.pool, &account, &id).await?.ok_or_else(|| no_such_endpoint(&path))?;
    Ok(Json(endpoint.to_value(false)))
}

/// `POST /v1/webhook_endpoints/{id}`: disable or enable. With an `Idempotency-Key` the update is
/// claimed, stored and replayed like a creation: a retry after a lost answer gets that answer
/// and does not set the status again over someone else's change in between.
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints/{id}",
    operation_id = "updateWebhookEndpoint",
    tag = "webhooks",
    summary = "Disable (or enable again) a webhook endpoint",
    params(param::EndpointId, param::UpdateKey),
    request_body(content = UpdateWebhookEndpointRequest, content_type = "application/json"),
    responses(
        (status = 200, description = OK, body = WebhookEndpointDoc,
            headers(("Idempotent-Replayed"))),
        Problems<ApiKey, (
            code::IdempotencyKeyInvalid,
            code::IdempotencyKeyInUse,
            code::IdempotencyKeyReused,
            code::InvalidRequest,
            code::ResourceMissing,
            code::PayloadTooLarge,
            code::UnsupportedMediaType,
        )>,
    )
)]
pub async fn update(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    meta: RequestMeta,
    OptionalKey(key): OptionalKey,
    ApiPath(path): ApiPath<String>,
    body: JsonBody<UpdateWebhookEndpointRequest>,
) -> Result<Response, ApiError> {
    let id = endpoint_id(&path)?;
    let status =
        if body.value.disabled { EndpointStatus::Disabled } else { EndpointStatus::Enabled };
    let Some(key) = key else {
        let endpoint = webhooks::set_status(&state.pool, &account, &id, status)
            .await?
            .ok_or_else(|| no_such_endpoint(&path))?;
        return Ok(stored_response(webhooks::updated_answer(&endpoint), false));
    };
    // An id the account never registered stores nothing for the key. A deleted endpoint goes on
    // to the claim: a retry of an update made before the deletion replays its answer, and a new
    // key stores the 404 (a deletion is for good).
    if !webhooks::registered(&state.pool, &account, &id).await? {
        return Err(no_such_endpoint(&path));
    }
    let params = UpdateEndpointParams { account_id: account.clone(), endpoint_id: id, status };
    let operation = UpdateEndpoint::new(state.operations.public_base_url.clone(), params);
    let keyed = Keyed { account: &account, credential: None, key: &key, meta: &meta, body: &body };
    keyed.run(&state, operation).await
}

/// `DELETE /v1/webhook_endpoints/{id}`
#[utoipa::path(
    delete,
    path = "/v1/webhook_endpoints/{id}",
    operation_id = "deleteWebhookEndpoint",
    tag = "webhooks",
    summary = "Delete a webhook endpoint; nothing more is delivered to it",
    params(param::EndpointId),
    responses(
        (status = 200, description = OK, body = Object),
        Problems<ApiKey, (code::ResourceMissing,)>,
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(path): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = endpoint_id(&path)?;
    if !webhooks::delete(&state.pool, &account, &id).await? {
        return Err(no_such_endpoint(&path));
    }
    Ok(Json(json!({"id": id, "object": "webhook_endpoint", "deleted": true})))
}

/// `GET /v1/webhook_endpoints/{id}/attempts`: the delivery log, newest first, each attempt's
/// outcome coarse (a timeout, a refused connection, a TLS error, a refused address, the
/// receiver's status).
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints/{id}/attempts",
    operation_id = "listWebhookAttempts",
    tag = "webhooks",
    summary = "The endpoint's delivery log: the latest 100 attempts, newest first",
    params(param::EndpointId),
    responses(
        (status = 200, description = OK, body = WebhookAttemptListDoc),
        Problems<ApiKey, (code::ResourceMissing,)>,
    )
)]
pub async fn attempts(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(path): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = endpoint_id(&path)?;
    webhooks::find(&state.pool, &account, &id).await?.ok_or_else(|| no_such_endpoint(&path))?;
    let data = webhooks::attempts(&state.pool, &id, LOG_LIMIT).await?;
    Ok(Json(json!({
        "object": "list", "data": data, "has_more": false,
        "url": format!("/v1/webhook_endpoints/{id}/attempts"),
    })))
}
