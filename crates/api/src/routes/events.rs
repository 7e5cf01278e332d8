//! `/v1/events`: what happened to the account's payments and refunds, newest first.
//!
//! Each event was written in the same transaction as its change (`payments_domain::events`), so
//! the list is exactly the committed changes; a webhook endpoint receives the same objects.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use payments_domain::events::{self, Event, EventType};
use payments_domain::ids::EventId;
use serde::{Deserialize, Serialize};
use utoipa_axum::routes;

use crate::app::AppState;
use crate::auth::Authenticated;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::idempotency::stored_response;
use crate::openapi::{ApiKey, ApiRouter, EventList, OK, Problems, code, param};
use crate::routes::lists::{List, ListParams, cursor_missing, raw_items};

/// This module's routes: each handler's path and method are in its `#[utoipa::path]`.
pub fn routes(api: ApiRouter) -> ApiRouter {
    api.routes(routes!(list)).routes(routes!(retrieve))
}

/// The query of `GET /v1/events`: the page, and optionally one type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventListParams {
    /// Only events of this type (`payment.succeeded`, …).
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// Page size, 1 to 100.
    pub limit: Option<u32>,
    /// Return events older than this id.
    pub starting_after: Option<String>,
    /// Return events newer than this id.
    pub ending_before: Option<String>,
}

/// An event as the API shows it (the document's `Event`; the bytes come from
/// `payments_domain::events::Event::to_json`, and a test holds the two together).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Event)]
pub struct EventDoc {
    /// `evt_…`
    pub id: String,
    /// Always `"event"`.
    pub object: String,
    /// What happened: `payment.succeeded`, `payment.requires_action` (the customer must
    /// authenticate; the outcome comes later as one of the others), `payment.requires_capture`,
    /// `payment.failed`, `payment.captured`, `payment.canceled`, `payment.updated`,
    /// `refund.succeeded`, `refund.failed`, `webhook_endpoint.disabled` (the worker disabled an
    /// endpoint that kept failing; `data.object` is the endpoint).
    #[serde(rename = "type")]
    pub event_type: String,
    /// Unix seconds: when the change committed.
    pub created: i64,
    /// `{"object": …}`: the payment or refund as the API showed it right after the change.
    pub data: serde_json::Value,
    /// Always `false` here.
    pub livemode: bool,
}

fn no_such_event(id: &str) -> ApiError {
    ApiError::resource_missing(format!("No such event: '{id}'.")).with_param("id")
}

/// `GET /v1/events/{id}`
#[utoipa::path(
    get,
    path = "/v1/events/{id}",
    operation_id = "retrieveEvent",
    tag = "events",
    summary = "Retrieve an event",
    description = "An event is kept {events_days} days (`retention.events_days`; Stripe keeps \
                   them 30), then deleted: reading it is `404 resource_missing`.",
    params(param::EventId),
    responses(
        (status = 200, description = OK, body = EventDoc),
        Problems<ApiKey, (code::ResourceMissing,)>,
    )
)]
pub async fn retrieve(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiPath(path): ApiPath<String>,
) -> Result<Response, ApiError> {
    let id = EventId::parse(&path).map_err(|_| no_such_event(&path))?;
    let event =
        events::find(&state.pool, &account, &id).await?.ok_or_else(|| no_such_event(&path))?;
    Ok(stored_response(idem::StoredResponse::json(200, event.to_json()), false))
}

/// `GET /v1/events`
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "listEvents",
    tag = "events",
    summary = "List events (each written in the same transaction as its change), newest first",
    description = "Events are kept {events_days} days (`retention.events_days`; Stripe keeps \
                   them 30), then deleted: a deleted one is no longer listed, and a cursor that \
                   names one is `404 resource_missing` with `param` the cursor's, as any unknown \
                   cursor: a poller away that long starts again from the newest.",
    params(param::EventType, param::Page),
    responses(
        (status = 200, description = OK, body = EventList),
        Problems<ApiKey, (code::InvalidRequest, code::ResourceMissing)>,
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Authenticated(account): Authenticated,
    ApiQuery(params): ApiQuery<EventListParams>,
) -> Result<Json<List>, ApiError> {
    let event_type = match params.event_type.as_deref() {
        None => None,
        Some(name) => Some(EventType::parse(name).ok_or_else(|| {
            ApiError::invalid_request("type", format!("`{name}` is not an event type."))
        })?),
    };
    let page = ListParams {
        limit: params.limit,
        starting_after: params.starting_after,
        ending_before: params.ending_before,
    }
    .validate::<EventId>()?;
    let mut conn = state.pool.acquire().await?;
    let (events, has_more) =
        events::list(&mut conn, &account, event_type, page.limit, page.cursor.as_ref())
            .await?
            .ok_or_else(|| cursor_missing(&page, "event"))?;
    let data = raw_items(events.iter().map(Event::to_json))?;
    Ok(Json(List { object: "list", data, has_more, url: "/v1/events".into() }))
}
