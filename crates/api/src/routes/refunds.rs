//! Refunds: `POST`/`GET /v1/payments/{id}/refunds` and `GET /v1/refunds/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::response::Response;
use payments_domain::operations::{self, CreateRefundOp, RefundParams};
use payments_domain::payments;
use payments_domain::refunds::{self, CreateRefundRequest};

use crate::app::AppState;
use crate::auth::Authenticated;
use crate::error::ApiError;
use crate::extract::{ApiQuery, JsonBody};
use crate::idempotency::{RequestMeta, RequiredKey, stored_response};
use crate::routes::payments::{
    Idempotent, List, ListParams, cursor_missing, no_such_payment, raw_items,
};

/// `POST /v1/payments/{id}/refunds`
pub async fn create(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    Path(id): Path<String>,
    meta: RequestMeta,
    RequiredKey(key): RequiredKey,
    body: JsonBody<CreateRefundRequest>,
) -> Result<Response, ApiError> {
    body.value.validate()?;
    payments::find(&state.pool, account.as_str(), &id)
        .await?
        .ok_or_else(|| no_such_payment(&id))?;
    let JsonBody { media_type, raw, value } = body;
    let params = RefundParams { account_id: account.to_string(), payment_id: id, request: value };
    let call = Idempotent { account: &account, key: &key, meta: &meta, media_type, raw: &raw };
    let operation = CreateRefundOp::new(state.operations.clone(), params.clone());
    call.run(&state, operations::CREATE_REFUND, &params, operation).await
}

/// `GET /v1/refunds/{id}`
pub async fn retrieve(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let refund = refunds::find(&state.pool, account.as_str(), &id).await?.ok_or_else(|| {
        ApiError::resource_missing(format!("No such refund: '{id}'.")).with_param("id")
    })?;
    Ok(stored_response(idem::StoredResponse::json(200, refund.to_json()), false))
}

/// `GET /v1/payments/{id}/refunds`
pub async fn list(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    Path(id): Path<String>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List>, ApiError> {
    let page = params.validate("re_")?;
    payments::find(&state.pool, account.as_str(), &id)
        .await?
        .ok_or_else(|| no_such_payment(&id))?;
    let (refunds, has_more) = refunds::list(&state.pool, &id, page.limit, page.cursor.as_ref())
        .await?
        .ok_or_else(|| cursor_missing(&page, "refund"))?;
    let data = raw_items(refunds.iter().map(refunds::Refund::to_json))?;
    Ok(Json(List { object: "list", data, has_more, url: format!("/v1/payments/{id}/refunds") }))
}
