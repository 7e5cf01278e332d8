//! `GET /openapi.json`: the OpenAPI 3.1 document of the whole API, derived from the router.
//!
//! Every route of the API is added through `ApiRouter::routes` with utoipa-axum's `routes!`,
//! which takes only handlers annotated with `#[utoipa::path(…)]`: the router and the document are
//! made by the same calls, so a route cannot be served without being documented. An annotation
//! says what only its operation knows (its id, summary, parameters, body and success response);
//! the pieces operations share are written once, here: the parameters (`param`), the problem
//! responses from the problem catalogue (`Problems`, with who may call the operation), the
//! response headers (`headers`), and the schemas no struct derives (`schemas`). `document`
//! finishes what the router collected with what the settings say (the retention, the base URL).
//! The schemas of the objects are derived (utoipa) from the very structs that serialize them
//! (`payments::Representation`, `refunds::Representation`) and that parse the requests
//! (`CreatePaymentRequest`, `PaymentPatch`, …). `make fuzz-api` holds the server's answers to the
//! document.

mod headers;
pub mod param;
mod problems;
mod schemas;
#[cfg(test)]
mod tests;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::schema::{Schema, SchemaType, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Components, InfoBuilder, OpenApi, RefOr, Required, ServerBuilder};
use utoipa::{PartialSchema, ToSchema};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};

pub use self::problems::{Access, ApiKey, Code, Codes, Keyed, Problems, Public, code};
pub use self::schemas::{
    EventList, PaymentList, Problem, ProcessorEvent, RefundList, WebhookEndpointList,
};
use crate::app::AppState;
use crate::settings::Settings;

/// The description of a `200` answer.
pub const OK: &str = "OK";

/// The description of a `201` answer of an operation that may replay it.
pub const CREATED: &str = "Created (or, with `Idempotent-Replayed: true`, the stored answer of an \
                           earlier request with this key)";

/// The API's router while its routes are added. It takes routes only through `routes!` (which
/// takes only annotated handlers), unlike `OpenApiRouter`, which also passes axum's `route`
/// through: a route added that way would be served and missing from the document.
#[derive(Default)]
pub struct ApiRouter(OpenApiRouter<AppState>);

impl std::fmt::Debug for ApiRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRouter").finish_non_exhaustive()
    }
}

impl ApiRouter {
    /// Serves and documents the handlers of one path, given as `routes!(get_handler,
    /// post_handler, …)`.
    ///
    /// # Panics
    /// When the handlers have different paths: `routes!` would serve every one of their methods
    /// on every one of their paths, more than the document says.
    pub fn routes(self, routes: UtoipaMethodRouter<AppState>) -> Self {
        let paths: Vec<&String> = routes.1.paths.keys().collect();
        assert_eq!(paths.len(), 1, "one `routes!` per path, not {paths:?}");
        Self(self.0.routes(routes))
    }

    /// Adds one module's routes (each module of `crate::routes` offers its own as `routes`, next
    /// to its handlers).
    pub fn with(self, add: fn(Self) -> Self) -> Self {
        add(self)
    }

    /// The router, and the paths of the document (`document` finishes it).
    pub fn split(self) -> (Router<AppState>, OpenApi) {
        self.0.split_for_parts()
    }
}

/// `GET /openapi.json`
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    summary = "This document",
    responses((status = 200, description = OK, body = Object))
)]
pub async fn serve(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], state.openapi.clone())
}

/// The document as JSON bytes.
pub fn json(api: OpenApi, settings: &Settings, public_base_url: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&document(api, settings, public_base_url)).unwrap_or_default()
}

/// The document: the paths and schemas the router collected (`ApiRouter::split`), finished.
pub fn document(mut api: OpenApi, settings: &Settings, public_base_url: &str) -> OpenApi {
    let retention = settings.idempotency.retention_hours;
    for item in api.paths.paths.values_mut() {
        for operation in operations(item) {
            finish(operation, retention, settings.retention.events_days);
        }
    }
    let components = api.components.get_or_insert_with(Components::new);
    components.schemas.insert(Problem::name().into_owned(), Problem::schema());
    components
        .security_schemes
        .insert("bearer".to_owned(), SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    components
        .security_schemes
        .insert("basic".to_owned(), SecurityScheme::Http(Http::new(HttpAuthScheme::Basic)));
    api.info = InfoBuilder::new()
        .title("Payments API")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(description(retention)))
        .build();
    api.servers = Some(vec![ServerBuilder::new().url(public_base_url).build()]);
    api
}

/// The operations of a path.
fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .flatten()
}

/// Adds to an operation what its annotation leaves to the document: the headers' descriptions,
/// `Request-Id`, the security requirement, the retention in the key's description, and the
/// events' retention in the description of the operations that read events.
fn finish(operation: &mut Operation, retention_hours: u32, events_days: u32) {
    if let Some(description) = &mut operation.description {
        *description = description.replace(param::EVENTS_DAYS, &events_days.to_string());
    }
    headers::describe(operation);
    optional_body(operation);
    // `ApiKey` and `Keyed` problems answer 401: the operation takes an API key.
    operation.security = Some(if operation.responses.responses.contains_key("401") {
        vec![
            SecurityRequirement::new("bearer", Vec::<String>::new()),
            SecurityRequirement::new("basic", Vec::<String>::new()),
        ]
    } else {
        Vec::new()
    });
    for parameter in operation.parameters.iter_mut().flatten() {
        if let Some(description) = &mut parameter.description {
            *description =
                description.replace(param::RETENTION_HOURS, &retention_hours.to_string());
        }
    }
}

/// utoipa reads a body of type `Option<T>` as one that may be JSON `null`; in an annotation here
/// it means one that may be absent (`extract::JsonBody` takes no body as `{}`, and refuses
/// `null`). So the body is made optional, and its schema `T`'s.
fn optional_body(operation: &mut Operation) {
    let Some(body) = &mut operation.request_body else { return };
    for content in body.content.values_mut() {
        let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema else { continue };
        let kept: Vec<&RefOr<Schema>> = one_of.items.iter().filter(|s| !is_null(s)).collect();
        if let [schema] = kept[..]
            && one_of.items.len() == 2
        {
            content.schema = Some(schema.clone());
            body.required = Some(Required::False);
        }
    }
}

fn is_null(schema: &RefOr<Schema>) -> bool {
    let RefOr::T(Schema::Object(object)) = schema else { return false };
    object.schema_type == SchemaType::Type(Type::Null)
}

fn description(retention_hours: u32) -> String {
    format!(
        "A Stripe-like payments API whose every money-moving request can be retried safely with \
         an `Idempotency-Key`.\n\n\
         **Authentication**: `Authorization: Bearer sk_test_…` (or HTTP Basic with the key as the \
         user name). Every object belongs to the key's account.\n\n\
         **Idempotency**: a payment's create, capture and cancel and a refund require an \
         `Idempotency-Key`; a PATCH of a payment and a webhook endpoint's create or update take \
         one if it is sent. With a key, the first final answer is \
         stored and every retry with the same key and the same request gets it back, byte for \
         byte, with `Idempotent-Replayed: true`. The same key with another request is `422`; \
         while the first request runs, `409` with `Retry-After`. A `500` or `503` stores nothing \
         final: a retry with the same key resumes where the first attempt stopped.\n\n\
         **Retention**: a completed key is kept for at least {retention_hours} hours \
         (`idempotency.retention_hours`); after that it may be deleted and a reuse is a new \
         request.\n\n\
         **Errors**: RFC 9457 problem details (`application/problem+json`) whose `type` is \
         `/problems/{{code}}` on this server."
    )
}
