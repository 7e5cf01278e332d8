//! Refunds: `POST`/`GET /v1/payments/{id}/refunds` and `GET /v1/refunds/{id}`.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use payments_domain::ids::RefundId;
use payments_domain::operations::{CreateRefundOp, RefundParams};
use payments_domain::payments;
use payments_domain::refunds::{self, CreateRefundRequest};
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::Authenticated;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::idempotency::{IdempotentPost, stored_response};
use crate::openapi::{ApiKey, ApiRouter, CREATED, Keyed, OK, Problems, RefundList, code, param};
use crate::routes::lists::{List, ListParams, cursor_missing, raw_items};
use crate::routes::payments::{no_such_payment, payment_id, require_payment};

/// This module's routes: each handler's path and method are in its `#[utoipa::path]`.
pub fn routes(api: ApiRouter) -> ApiRouter {
    api.routes(routes!(list, create)).routes(routes!(retrieve))
}

/// `POST /v1/payments/{id}/refunds`
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/refunds",
    operation_id = "createRefund",
    tag = "refunds",
    summary = "Refund a captured payment, in whole or in part",
    params(param::PaymentId, param::IdempotencyKey),
    request_body(content = Option<CreateRefundRequest>, content_type = "application/json"),
    responses(
        (status = 201, description = CREATED, body = refunds::Representation<'static>,
            headers(("Location"), ("ETag"), ("Idempotent-Replayed"))),
        Problems<Keyed, (
            code::ResourceMissing,
            code::PaymentUnexpectedState,
            code::AmountTooLarge,
            code::ProcessorUnavailable,
            code::OperationNeedsReview,
        )>,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    // Checked after the key: an unauthenticated request is a 401 whatever its path says.
    path: Result<ApiPath<String>, ApiError>,
    post: IdempotentPost<CreateRefundRequest>,
) -> Result<Response, ApiError> {
    let ApiPath(id) = post.admit(&state, path).await?;
    let request = post.admit(&state, post.body.value.validate()).await?;
    let payment_id = require_payment(&state, &post, &id).await?;
    let params = RefundParams { account_id: post.account().clone(), payment_id, request };
    let operation = CreateRefundOp::new(state.operations.clone(), params);
    post.run(&state, operation).await
}

/// `GET /v1/refunds/{id}`
#[utoipa::path(
    get,
    path = "/v1/refunds/{id}",
    operation_id = "retrieveRefund",
    tag = "refunds",
    summary = "Retrieve a refund",
    params(param::RefundId),
    responses(
        (status = 200, description = OK, body = refunds::Representation<'static>,
            headers(("ETag"))),
        Problems<ApiKey, (code::ResourceMissing,)>,
    )
)]
pub async fn retrieve(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(path): ApiPath<String>,
) -> Result<Response, ApiError> {
    let missing =
        || ApiError::resource_missing(format!("No such refund: '{path}'.")).with_param("id");
    let id = RefundId::parse(&path).map_err(|_| missing())?;
    let refund = refunds::find(&state.pool, &account, &id).await?.ok_or_else(missing)?;
    Ok(stored_response(idem::StoredResponse::json(200, refund.to_json()), false))
}

/// `GET /v1/payments/{id}/refunds`
#[utoipa::path(
    get,
    path = "/v1/payments/{id}/refunds",
    operation_id = "listRefunds",
    tag = "refunds",
    summary = "List a payment's refunds, newest first",
    params(param::PaymentId, param::Page),
    responses(
        (status = 200, description = OK, body = RefundList),
        Problems<ApiKey, (code::InvalidRequest, code::ResourceMissing)>,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List>, ApiError> {
    let page = params.validate::<RefundId>()?;
    let payment = payment_id(&id)?;
    payments::find(&state.pool, &account, &payment).await?.ok_or_else(|| no_such_payment(&id))?;
    let (refunds, has_more) =
        refunds::list(&state.pool, &payment, page.limit, page.cursor.as_ref())
            .await?
            .ok_or_else(|| cursor_missing(&page, "refund"))?;
    let data = raw_items(refunds.iter().map(refunds::Refund::to_json))?;
    Ok(Json(List { object: "list", data, has_more, url: format!("/v1/payments/{id}/refunds") }))
}
