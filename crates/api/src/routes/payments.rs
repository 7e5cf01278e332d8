//! `/v1/payments`: create, read, list, update, capture, cancel.
//!
//! Money-moving POSTs go through the idempotency runner; the checks that store nothing
//! (authentication, key syntax, media type, body validation, the payment's existence) run first,
//! in that order, as the API contract requires.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use payments_domain::ids::PaymentId;
use payments_domain::money::Amount;
use payments_domain::operations::{
    self, CancelParams, CancelPayment, CancellationReason, CaptureParams, CapturePayment,
    CreatePayment, CreatePaymentParams,
};
use payments_domain::operations::{UpdateParams, UpdatePayment};
use payments_domain::payments::Patched;
use payments_domain::payments::{self, CreatePaymentRequest, Payment};
use serde::Deserialize;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::Authenticated;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery, JsonBody};
use crate::idempotency::{IdempotentPost, Keyed, OptionalKey, RequestMeta, stored_response};
use crate::openapi::{self, ApiRouter, CREATED, OK, PaymentList, Problems, code, param};
use crate::routes::lists::{List, ListParams, cursor_missing, raw_items};

/// This module's routes: each handler's path and method are in its `#[utoipa::path]`.
pub fn routes(api: ApiRouter) -> ApiRouter {
    api.routes(routes!(list, create))
        .routes(routes!(retrieve, update))
        .routes(routes!(capture))
        .routes(routes!(cancel))
}

/// A payment as a response: its representation and ETag.
pub fn payment_response(payment: &Payment) -> Response {
    stored_response(operations::payment_answer(200, payment, false), false)
}

/// The 404 for a payment that does not exist or is another account's.
pub(crate) fn no_such_payment(id: &str) -> ApiError {
    ApiError::resource_missing(format!("No such payment: '{id}'.")).with_param("id")
}

/// `POST /v1/payments`
#[utoipa::path(
    post,
    path = "/v1/payments",
    operation_id = "createPayment",
    tag = "payments",
    summary = "Create a payment and charge it (or authorize it, with capture_method=manual)",
    params(param::IdempotencyKey),
    request_body(content = CreatePaymentRequest, content_type = "application/json"),
    responses(
        (status = 201, description = CREATED, body = payments::Representation<'static>,
            headers(("Location"), ("ETag"), ("Idempotent-Replayed"))),
        Problems<openapi::Keyed, (
            code::CardDeclined,
            code::ProcessorUnavailable,
            code::OperationNeedsReview,
        )>,
    )
)]
pub async fn create(
    State(state): State<AppState>,
    post: IdempotentPost<CreatePaymentRequest>,
) -> Result<Response, ApiError> {
    let request = post.admit(&state, post.body.value.validate()).await?;
    let params = CreatePaymentParams { account_id: post.account().clone(), request };
    let operation = CreatePayment::new(state.operations.clone(), params);
    post.run(&state, operation).await
}

/// The payment a path names, if the path holds a payment's id; else the 404 for it.
pub(crate) fn payment_id(path: &str) -> Result<PaymentId, ApiError> {
    PaymentId::parse(path).map_err(|_| no_such_payment(path))
}

/// The payment a capture, cancel or refund acts on must exist: a 404 stores nothing.
pub(crate) async fn require_payment<T>(
    state: &AppState,
    post: &IdempotentPost<T>,
    path: &str,
) -> Result<PaymentId, ApiError> {
    let id = post.admit(state, payment_id(path)).await?;
    let found = payments::find(&state.pool, post.account(), &id).await;
    let found = found.map_err(ApiError::from).and_then(|p| p.ok_or_else(|| no_such_payment(path)));
    post.admit(state, found).await.map(|_| id)
}

/// `GET /v1/payments/{id}`
#[utoipa::path(
    get,
    path = "/v1/payments/{id}",
    operation_id = "retrievePayment",
    tag = "payments",
    summary = "Retrieve a payment",
    params(param::PaymentId),
    responses(
        (status = 200, description = OK, body = payments::Representation<'static>,
            headers(("ETag"))),
        Problems<openapi::ApiKey, (code::ResourceMissing,)>,
    )
)]
pub async fn retrieve(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(path): ApiPath<String>,
) -> Result<Response, ApiError> {
    let id = payment_id(&path)?;
    let payment =
        payments::find(&state.pool, &account, &id).await?.ok_or_else(|| no_such_payment(&path))?;
    Ok(payment_response(&payment))
}

/// `GET /v1/payments`
#[utoipa::path(
    get,
    path = "/v1/payments",
    operation_id = "listPayments",
    tag = "payments",
    summary = "List payments, newest first",
    params(param::Page),
    responses(
        (status = 200, description = OK, body = PaymentList),
        Problems<openapi::ApiKey, (code::InvalidRequest,)>,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List>, ApiError> {
    let page = params.validate::<PaymentId>()?;
    let (payments, has_more) =
        payments::list(&state.pool, &account, page.limit, page.cursor.as_ref())
            .await?
            .ok_or_else(|| cursor_missing(&page, "payment"))?;
    let data = raw_items(payments.iter().map(Payment::to_json))?;
    Ok(Json(List { object: "list", data, has_more, url: "/v1/payments".into() }))
}

/// `PATCH /v1/payments/{id}`: a JSON Merge Patch (RFC 7386) of `description` and `metadata`.
pub use payments_domain::payments::PaymentPatch;

/// `PATCH /v1/payments/{id}`. Without an `Idempotency-Key` the patch is applied at once. With
/// one, it is claimed, stored and replayed like a POST: a merge patch retried after someone
/// else's change would undo that change, and a replay does not.
#[utoipa::path(
    patch,
    path = "/v1/payments/{id}",
    operation_id = "updatePayment",
    tag = "payments",
    summary = "Change a payment's description and metadata (JSON Merge Patch, RFC 7386)",
    params(param::PaymentId, param::IfMatch, param::PatchKey),
    request_body(content = PaymentPatch, content_type = "application/merge-patch+json"),
    responses(
        (status = 200, description = OK, body = payments::Representation<'static>,
            headers(("ETag"))),
        Problems<openapi::ApiKey, (
            code::IdempotencyKeyInvalid,
            code::IdempotencyKeyInUse,
            code::IdempotencyKeyReused,
            code::InvalidRequest,
            code::ResourceMissing,
            code::PreconditionFailed,
            code::PayloadTooLarge,
            code::UnsupportedMediaType,
        )>,
    )
)]
pub async fn update(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(path): ApiPath<String>,
    meta: RequestMeta,
    OptionalKey(key): OptionalKey,
    body: JsonBody<PaymentPatch>,
) -> Result<Response, ApiError> {
    let if_match = meta.if_match.clone();
    body.value.validate()?;
    let id = payment_id(&path)?;
    let Some(key) = key else {
        let mut tx = state.pool.begin().await?;
        let patched =
            payments::apply(&mut tx, &account, &id, &body.value, if_match.as_deref()).await?;
        let payment = match patched {
            Patched::Updated(payment) => payment,
            Patched::Missing => return Err(no_such_payment(&path)),
            Patched::Stale { current_etag } => {
                return Err(ApiError::from_problem(payments::stale_problem(&current_etag)));
            }
        };
        tx.commit().await?;
        return Ok(payment_response(&payment));
    };
    // An unknown payment stores nothing for the key, as for a capture.
    payments::find(&state.pool, &account, &id).await?.ok_or_else(|| no_such_payment(&path))?;
    let patch = body.value.clone();
    let params = UpdateParams { account_id: account.clone(), payment_id: id, patch, if_match };
    let operation = UpdatePayment::new(state.operations.public_base_url.clone(), params);
    let keyed = Keyed { account: &account, credential: None, key: &key, meta: &meta, body: &body };
    keyed.run(&state, operation).await
}

/// `POST /v1/payments/{id}/capture`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CaptureBody {
    /// Default: the whole authorized amount.
    #[serde(default)]
    amount_to_capture: Option<i64>,
}

/// `POST /v1/payments/{id}/capture`
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/capture",
    operation_id = "capturePayment",
    tag = "payments",
    summary = "Capture an authorized payment",
    params(param::PaymentId, param::IdempotencyKey),
    request_body(content = Option<CaptureBody>, content_type = "application/json"),
    responses(
        (status = 200, description = OK, body = payments::Representation<'static>,
            headers(("ETag"), ("Idempotent-Replayed"))),
        Problems<openapi::Keyed, (
            code::ResourceMissing,
            code::PaymentUnexpectedState,
            code::PaymentRequiresAction,
            code::AmountTooLarge,
            code::ProcessorUnavailable,
            code::OperationNeedsReview,
        )>,
    )
)]
pub async fn capture(
    State(state): State<AppState>,
    // Checked after the key: an unauthenticated request is a 401 whatever its path says.
    path: Result<ApiPath<String>, ApiError>,
    post: IdempotentPost<CaptureBody>,
) -> Result<Response, ApiError> {
    let ApiPath(id) = post.admit(&state, path).await?;
    let amount_to_capture = post.body.value.amount_to_capture.map(|amount| {
        Amount::new(amount).ok_or_else(|| {
            ApiError::invalid_request(
                "amount_to_capture",
                "`amount_to_capture` must be a positive integer.",
            )
        })
    });
    let amount_to_capture = post.admit(&state, amount_to_capture.transpose()).await?;
    let payment_id = require_payment(&state, &post, &id).await?;
    let params =
        CaptureParams { account_id: post.account().clone(), payment_id, amount_to_capture };
    let operation = CapturePayment::new(state.operations.clone(), params);
    post.run(&state, operation).await
}

/// `POST /v1/payments/{id}/cancel`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why (optional).
    #[serde(default)]
    cancellation_reason: Option<CancellationReason>,
}

/// `POST /v1/payments/{id}/cancel`
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/cancel",
    operation_id = "cancelPayment",
    tag = "payments",
    summary = "Cancel an authorized payment, releasing the authorization",
    params(param::PaymentId, param::IdempotencyKey),
    request_body(content = Option<CancelBody>, content_type = "application/json"),
    responses(
        (status = 200, description = OK, body = payments::Representation<'static>,
            headers(("ETag"), ("Idempotent-Replayed"))),
        Problems<openapi::Keyed, (
            code::ResourceMissing,
            code::PaymentUnexpectedState,
            code::PaymentRequiresAction,
            code::ProcessorUnavailable,
            code::OperationNeedsReview,
        )>,
    )
)]
pub async fn cancel(
    State(state): State<AppState>,
    // Checked after the key: an unauthenticated request is a 401 whatever its path says.
    path: Result<ApiPath<String>, ApiError>,
    post: IdempotentPost<CancelBody>,
) -> Result<Response, ApiError> {
    let ApiPath(id) = post.admit(&state, path).await?;
    let payment_id = require_payment(&state, &post, &id).await?;
    let params = CancelParams {
        account_id: post.account().clone(),
        payment_id,
        cancellation_reason: post.body.value.cancellation_reason,
    };
    let operation = CancelPayment::new(state.operations.clone(), params);
    post.run(&state, operation).await
}
