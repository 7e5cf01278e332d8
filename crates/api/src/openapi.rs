//! `GET /openapi.json`: the OpenAPI 3.1 document of the whole API, built from the code.
//!
//! The schemas of the objects are derived (utoipa) from the very structs that serialize them
//! (`payments::Representation`, `refunds::Representation`) and that parse the requests
//! (`CreatePaymentRequest`, `PaymentPatch`, …); the problem responses come from the problem
//! catalogue (`ProblemCode::ALL`); the retention policy from the settings. The table below says,
//! per operation, what the router cannot: which headers it takes and which problems it answers.
//! A test holds every route of the router to this table, and `make fuzz-api` holds the server's
//! answers to the document.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use payments_domain::operations::CancellationReason;
use payments_domain::payments::{CaptureMethod, CreatePaymentRequest, PaymentStatus};
use payments_domain::refunds::{CreateRefundRequest, RefundReason};
use payments_domain::{payments, refunds};
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, InfoBuilder, OpenApi, OpenApiBuilder, PathsBuilder, Ref, RefOr, Required,
    ResponseBuilder, ServerBuilder,
};

use crate::app::AppState;
use crate::error::ProblemCode;
use crate::routes::payments::{CancelBody, CaptureBody, PaymentPatch};
use crate::settings::Settings;

/// What an operation does with an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// Every request must carry one; the answer is stored and replayed.
    Required,
    /// Validated if present, nothing stored (PATCH is idempotent by nature).
    Validated,
    /// If present, the request is claimed and its answer stored and replayed; without one, each
    /// request acts (a webhook endpoint's creation).
    Optional,
    /// Not read.
    Ignored,
}

/// One operation of the API as the document describes it.
#[derive(Debug)]
pub struct Endpoint {
    /// `get`, `post` or `patch`.
    pub method: &'static str,
    /// The path as the router has it (`/v1/payments/{id}`).
    pub path: &'static str,
    id: &'static str,
    summary: &'static str,
    tag: &'static str,
    authenticated: bool,
    key: Key,
    /// The request body's schema, its media type, and whether it is required.
    body: Option<(&'static str, &'static str, bool)>,
    params: &'static [Param],
    /// Status, media type, schema (`None`: free-form), headers.
    success: (u16, &'static str, Option<&'static str>, &'static [&'static str]),
    /// Beyond those every authenticated operation can answer.
    problems: &'static [ProblemCode],
}

#[derive(Debug, Clone, Copy)]
enum Param {
    /// `{id}` of a payment.
    PaymentId,
    /// `{id}` of a refund.
    RefundId,
    /// `{code}` of a problem.
    ProblemCode,
    /// `limit`, `starting_after`, `ending_before`.
    Page,
    /// `If-Match`.
    IfMatch,
    /// `{id}` of an event.
    EventId,
    /// `{id}` of a webhook endpoint.
    EndpointId,
    /// `type` of `GET /v1/events`.
    EventType,
    /// `Stripe-Signature` of the processor's webhooks.
    StripeSignature,
}

use ProblemCode as P;

/// Problems any authenticated operation can answer.
const AUTHENTICATED: &[ProblemCode] = &[
    P::AuthenticationRequired,
    P::InvalidApiKey,
    P::RateLimited,
    P::InternalError,
    P::ServiceUnavailable,
];
/// Problems of every operation with a key and a body, before and around the claim.
const KEYED: &[ProblemCode] = &[
    P::IdempotencyKeyMissing,
    P::IdempotencyKeyInvalid,
    P::IdempotencyKeyInUse,
    P::IdempotencyKeyReused,
    P::InvalidRequest,
    P::PayloadTooLarge,
    P::UnsupportedMediaType,
    P::ServiceUnavailable,
];
/// Headers of a response that carries a payment or a refund.
const OBJECT_HEADERS: &[&str] = &["ETag", "Idempotent-Replayed"];
const CREATED_HEADERS: &[&str] = &["Location", "ETag", "Idempotent-Replayed"];

/// Every operation the router serves.
pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        method: "post",
        path: "/v1/payments",
        id: "createPayment",
        summary: "Create a payment and charge it (or authorize it, with capture_method=manual)",
        tag: "payments",
        authenticated: true,
        key: Key::Required,
        body: Some(("CreatePaymentRequest", "application/json", true)),
        params: &[],
        success: (201, "application/json", Some("Payment"), CREATED_HEADERS),
        problems: &[P::CardDeclined, P::ProcessorUnavailable, P::OperationNeedsReview],
    },
    Endpoint {
        method: "get",
        path: "/v1/payments",
        id: "listPayments",
        summary: "List payments, newest first",
        tag: "payments",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::Page],
        success: (200, "application/json", Some("PaymentList"), &[]),
        problems: &[P::InvalidRequest],
    },
    Endpoint {
        method: "get",
        path: "/v1/payments/{id}",
        id: "retrievePayment",
        summary: "Retrieve a payment",
        tag: "payments",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::PaymentId],
        success: (200, "application/json", Some("Payment"), &["ETag"]),
        problems: &[P::ResourceMissing],
    },
    Endpoint {
        method: "patch",
        path: "/v1/payments/{id}",
        id: "updatePayment",
        summary: "Change a payment's description and metadata (JSON Merge Patch, RFC 7386)",
        tag: "payments",
        authenticated: true,
        key: Key::Validated,
        body: Some(("PaymentPatch", "application/merge-patch+json", true)),
        params: &[Param::PaymentId, Param::IfMatch],
        success: (200, "application/json", Some("Payment"), &["ETag"]),
        problems: &[
            P::IdempotencyKeyInvalid,
            P::IdempotencyKeyInUse,
            P::IdempotencyKeyReused,
            P::InvalidRequest,
            P::ResourceMissing,
            P::PreconditionFailed,
            P::PayloadTooLarge,
            P::UnsupportedMediaType,
        ],
    },
    Endpoint {
        method: "post",
        path: "/v1/payments/{id}/capture",
        id: "capturePayment",
        summary: "Capture an authorized payment",
        tag: "payments",
        authenticated: true,
        key: Key::Required,
        body: Some(("CaptureBody", "application/json", false)),
        params: &[Param::PaymentId],
        success: (200, "application/json", Some("Payment"), OBJECT_HEADERS),
        problems: &[
            P::ResourceMissing,
            P::PaymentUnexpectedState,
            P::AmountTooLarge,
            P::ProcessorUnavailable,
            P::OperationNeedsReview,
        ],
    },
    Endpoint {
        method: "post",
        path: "/v1/payments/{id}/cancel",
        id: "cancelPayment",
        summary: "Cancel an authorized payment, releasing the authorization",
        tag: "payments",
        authenticated: true,
        key: Key::Required,
        body: Some(("CancelBody", "application/json", false)),
        params: &[Param::PaymentId],
        success: (200, "application/json", Some("Payment"), OBJECT_HEADERS),
        problems: &[
            P::ResourceMissing,
            P::PaymentUnexpectedState,
            P::ProcessorUnavailable,
            P::OperationNeedsReview,
        ],
    },
    Endpoint {
        method: "post",
        path: "/v1/payments/{id}/refunds",
        id: "createRefund",
        summary: "Refund a captured payment, in whole or in part",
        tag: "refunds",
        authenticated: true,
        key: Key::Required,
        body: Some(("CreateRefundRequest", "application/json", false)),
        params: &[Param::PaymentId],
        success: (201, "application/json", Some("Refund"), CREATED_HEADERS),
        problems: &[
            P::ResourceMissing,
            P::PaymentUnexpectedState,
            P::AmountTooLarge,
            P::ProcessorUnavailable,
            P::OperationNeedsReview,
        ],
    },
    Endpoint {
        method: "get",
        path: "/v1/payments/{id}/refunds",
        id: "listRefunds",
        summary: "List a payment's refunds, newest first",
        tag: "refunds",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::PaymentId, Param::Page],
        success: (200, "application/json", Some("RefundList"), &[]),
        problems: &[P::InvalidRequest, P::ResourceMissing],
    },
    Endpoint {
        method: "get",
        path: "/v1/refunds/{id}",
        id: "retrieveRefund",
        summary: "Retrieve a refund",
        tag: "refunds",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::RefundId],
        success: (200, "application/json", Some("Refund"), &["ETag"]),
        problems: &[P::ResourceMissing],
    },
    Endpoint {
        method: "get",
        path: "/v1/events",
        id: "listEvents",
        summary: "List events (each written in the same transaction as its change), newest first",
        tag: "events",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::EventType, Param::Page],
        success: (200, "application/json", Some("EventList"), &[]),
        problems: &[P::InvalidRequest, P::ResourceMissing],
    },
    Endpoint {
        method: "get",
        path: "/v1/events/{id}",
        id: "retrieveEvent",
        summary: "Retrieve an event",
        tag: "events",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::EventId],
        success: (200, "application/json", Some("Event"), &[]),
        problems: &[P::ResourceMissing],
    },
    Endpoint {
        method: "post",
        path: "/v1/webhook_endpoints",
        id: "createWebhookEndpoint",
        summary: "Register a webhook endpoint; the answer carries its signing secret, once",
        tag: "webhooks",
        authenticated: true,
        key: Key::Optional,
        body: Some(("CreateWebhookEndpointRequest", "application/json", true)),
        params: &[],
        success: (
            201,
            "application/json",
            Some("WebhookEndpoint"),
            &["Location", "Idempotent-Replayed"],
        ),
        problems: &[
            P::IdempotencyKeyInvalid,
            P::IdempotencyKeyInUse,
            P::IdempotencyKeyReused,
            P::InvalidRequest,
            P::PayloadTooLarge,
            P::UnsupportedMediaType,
        ],
    },
    Endpoint {
        method: "get",
        path: "/v1/webhook_endpoints",
        id: "listWebhookEndpoints",
        summary: "List the account's webhook endpoints",
        tag: "webhooks",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[],
        success: (200, "application/json", Some("WebhookEndpointList"), &[]),
        problems: &[],
    },
    Endpoint {
        method: "get",
        path: "/v1/webhook_endpoints/{id}",
        id: "retrieveWebhookEndpoint",
        summary: "Retrieve a webhook endpoint (without its secret)",
        tag: "webhooks",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::EndpointId],
        success: (200, "application/json", Some("WebhookEndpoint"), &[]),
        problems: &[P::ResourceMissing],
    },
    Endpoint {
        method: "post",
        path: "/v1/webhook_endpoints/{id}",
        id: "updateWebhookEndpoint",
        summary: "Disable (or enable again) a webhook endpoint",
        tag: "webhooks",
        authenticated: true,
        key: Key::Ignored,
        body: Some(("UpdateWebhookEndpointRequest", "application/json", true)),
        params: &[Param::EndpointId],
        success: (200, "application/json", Some("WebhookEndpoint"), &[]),
        problems: &[
            P::InvalidRequest,
            P::ResourceMissing,
            P::PayloadTooLarge,
            P::UnsupportedMediaType,
        ],
    },
    Endpoint {
        method: "delete",
        path: "/v1/webhook_endpoints/{id}",
        id: "deleteWebhookEndpoint",
        summary: "Delete a webhook endpoint; nothing more is delivered to it",
        tag: "webhooks",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::EndpointId],
        success: (200, "application/json", None, &[]),
        problems: &[P::ResourceMissing],
    },
    Endpoint {
        method: "get",
        path: "/v1/webhook_endpoints/{id}/attempts",
        id: "listWebhookAttempts",
        summary: "The endpoint's delivery log: the latest 100 attempts, newest first",
        tag: "webhooks",
        authenticated: true,
        key: Key::Ignored,
        body: None,
        params: &[Param::EndpointId],
        success: (200, "application/json", None, &[]),
        problems: &[P::ResourceMissing],
    },
    Endpoint {
        method: "post",
        path: "/webhooks/processor",
        id: "receiveProcessorWebhook",
        summary: "The card processor's webhooks (charge.succeeded, charge.failed, charge.captured, \
                  charge.refunded), signed with Stripe-Signature; recorded once per event id",
        tag: "webhooks",
        authenticated: false,
        key: Key::Ignored,
        body: Some(("ProcessorEvent", "application/json", true)),
        params: &[Param::StripeSignature],
        success: (200, "application/json", Some("ProcessorWebhookReceipt"), &[]),
        problems: &[
            P::InvalidRequest,
            P::ResourceMissing,
            P::PayloadTooLarge,
            P::InternalError,
            P::ServiceUnavailable,
        ],
    },
    Endpoint {
        method: "get",
        path: "/healthz",
        id: "healthz",
        summary: "The process is alive",
        tag: "operations",
        authenticated: false,
        key: Key::Ignored,
        body: None,
        params: &[],
        success: (200, "application/json", None, &[]),
        problems: &[],
    },
    Endpoint {
        method: "get",
        path: "/readyz",
        id: "readyz",
        summary: "The database answers and the migrations are applied (503 otherwise)",
        tag: "operations",
        authenticated: false,
        key: Key::Ignored,
        body: None,
        params: &[],
        success: (200, "application/json", None, &[]),
        problems: &[],
    },
    Endpoint {
        method: "get",
        path: "/metrics",
        id: "metrics",
        summary: "Prometheus metrics (text exposition format)",
        tag: "operations",
        authenticated: false,
        key: Key::Ignored,
        body: None,
        params: &[],
        success: (200, "text/plain", None, &[]),
        problems: &[],
    },
    Endpoint {
        method: "get",
        path: "/openapi.json",
        id: "openapi",
        summary: "This document",
        tag: "operations",
        authenticated: false,
        key: Key::Ignored,
        body: None,
        params: &[],
        success: (200, "application/json", None, &[]),
        problems: &[],
    },
    Endpoint {
        method: "get",
        path: "/problems/{code}",
        id: "problem",
        summary: "The documentation page of a problem type",
        tag: "operations",
        authenticated: false,
        key: Key::Ignored,
        body: None,
        params: &[Param::ProblemCode],
        success: (200, "text/html", None, &[]),
        problems: &[P::ResourceMissing],
    },
];

/// `GET /openapi.json`
pub async fn serve(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], state.openapi.clone())
}

/// The document as JSON bytes.
pub fn json(settings: &Settings, public_base_url: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&document(settings, public_base_url)).unwrap_or_default()
}

/// The document.
pub fn document(settings: &Settings, public_base_url: &str) -> OpenApi {
    let retention = settings.idempotency.retention_hours;
    let mut paths = PathsBuilder::new();
    for endpoint in ENDPOINTS {
        let method = match endpoint.method {
            "post" => HttpMethod::Post,
            "patch" => HttpMethod::Patch,
            "delete" => HttpMethod::Delete,
            _ => HttpMethod::Get,
        };
        paths = paths.path(endpoint.path, PathItem::new(method, operation(endpoint, retention)));
    }
    let components = ComponentsBuilder::new()
        .schema_from::<payments::Representation<'static>>()
        .schema_from::<refunds::Representation<'static>>()
        .schema_from::<PaymentStatus>()
        .schema_from::<CaptureMethod>()
        .schema_from::<CreatePaymentRequest>()
        .schema_from::<CreateRefundRequest>()
        .schema_from::<RefundReason>()
        .schema_from::<CancellationReason>()
        .schema_from::<PaymentPatch>()
        .schema_from::<CaptureBody>()
        .schema_from::<CancelBody>()
        .schema("PaymentList", list("Payment", "/v1/payments"))
        .schema("RefundList", list("Refund", "/v1/payments/{id}/refunds"))
        .schema_from::<crate::routes::events::EventDoc>()
        .schema_from::<crate::routes::webhook_endpoints::WebhookEndpointDoc>()
        .schema_from::<crate::routes::webhook_endpoints::CreateWebhookEndpointRequest>()
        .schema_from::<crate::routes::webhook_endpoints::UpdateWebhookEndpointRequest>()
        .schema("EventList", list("Event", "/v1/events"))
        .schema("WebhookEndpointList", list("WebhookEndpoint", "/v1/webhook_endpoints"))
        .schema_from::<crate::routes::processor_webhooks::ProcessorWebhookReceipt>()
        .schema("ProcessorEvent", processor_event())
        .schema("Problem", problem())
        .security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)))
        .security_scheme("basic", SecurityScheme::Http(Http::new(HttpAuthScheme::Basic)))
        .build();
    let info = InfoBuilder::new()
        .title("Payments API")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(description(retention)))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .servers(Some(vec![ServerBuilder::new().url(public_base_url).build()]))
        .paths(paths.build())
        .components(Some(components))
        .build()
}

fn description(retention_hours: u32) -> String {
    format!(
        "A Stripe-like payments API whose every money-moving request can be retried safely with \
         an `Idempotency-Key`.\n\n\
         **Authentication**: `Authorization: Bearer sk_test_…` (or HTTP Basic with the key as the \
         user name). Every object belongs to the key's account.\n\n\
         **Idempotency**: every POST requires an `Idempotency-Key`; the first final answer is \
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

fn operation(endpoint: &Endpoint, retention_hours: u32) -> utoipa::openapi::path::Operation {
    let mut op = OperationBuilder::new()
        .operation_id(Some(endpoint.id))
        .summary(Some(endpoint.summary))
        .tag(endpoint.tag);
    op = if endpoint.authenticated {
        op.security(SecurityRequirement::new("bearer", Vec::<String>::new()))
            .security(SecurityRequirement::new("basic", Vec::<String>::new()))
    } else {
        op.securities(Some(Vec::<SecurityRequirement>::new()))
    };
    for param in endpoint.params {
        for built in parameters(*param) {
            op = op.parameter(built);
        }
    }
    if endpoint.key != Key::Ignored {
        op = op.parameter(idempotency_key(endpoint.key, retention_hours));
    }
    if let Some((schema, media_type, required)) = endpoint.body {
        let body = RequestBodyBuilder::new()
            .content(
                media_type,
                ContentBuilder::new().schema(Some(Ref::from_schema_name(schema))).build(),
            )
            .required(Some(if required { Required::True } else { Required::False }))
            .build();
        op = op.request_body(Some(body));
    }
    let (status, media_type, schema, headers) = endpoint.success;
    let mut success = ResponseBuilder::new().description(success_description(status));
    let content = ContentBuilder::new()
        .schema(schema.map(|s| RefOr::Ref(Ref::from_schema_name(s))).or_else(|| {
            Some(RefOr::T(if media_type == "application/json" {
                Schema::Object(ObjectBuilder::new().schema_type(Type::Object).build())
            } else {
                string()
            }))
        }))
        .build();
    success =
        success.content(media_type, content).header("Request-Id", response_header("Request-Id"));
    for name in headers {
        success = success.header(*name, response_header(name));
    }
    op = op.response(status.to_string(), success.build());
    if endpoint.path == "/readyz" {
        op = op.response(
            "503",
            ResponseBuilder::new()
                .description("The database does not answer or the schema is behind")
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Schema::Object(
                            ObjectBuilder::new().schema_type(Type::Object).build(),
                        )))
                        .build(),
                )
                .build(),
        );
    }
    let mut problems: BTreeMap<u16, Vec<ProblemCode>> = BTreeMap::new();
    let common: &[ProblemCode] = if endpoint.authenticated { AUTHENTICATED } else { &[] };
    let keyed: &[ProblemCode] = if endpoint.key == Key::Required { KEYED } else { &[] };
    for code in common.iter().chain(keyed).chain(endpoint.problems) {
        let codes = problems.entry(code.status()).or_default();
        if !codes.contains(code) {
            codes.push(*code);
        }
    }
    for (status, codes) in problems {
        op = op.response(status.to_string(), problem_response(endpoint, &codes));
    }
    op.build()
}

fn success_description(status: u16) -> &'static str {
    match status {
        201 => {
            "Created (or, with `Idempotent-Replayed: true`, the stored answer of an earlier request with this key)"
        }
        _ => "OK",
    }
}

fn problem_response(endpoint: &Endpoint, codes: &[ProblemCode]) -> utoipa::openapi::Response {
    let listed: Vec<String> =
        codes.iter().map(|c| format!("[`{c}`](/problems/{c}): {}", c.title())).collect();
    let mut response = ResponseBuilder::new()
        .description(listed.join("; "))
        .content(
            "application/problem+json",
            ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build(),
        )
        .header("Request-Id", response_header("Request-Id"));
    if codes.iter().any(|c| {
        matches!(
            c,
            P::IdempotencyKeyInUse
                | P::RateLimited
                | P::ProcessorUnavailable
                | P::ServiceUnavailable
        )
    }) {
        response = response.header("Retry-After", response_header("Retry-After"));
    }
    if endpoint.key == Key::Required
        && codes.iter().any(|c| c.doc().stored_for_replay.starts_with("yes"))
    {
        response = response.header("Idempotent-Replayed", response_header("Idempotent-Replayed"));
    }
    response.build()
}

fn response_header(name: &str) -> utoipa::openapi::header::Header {
    let (schema, description) = match name {
        "Request-Id" => (string(), "This request's id (`req_…`); a replay gets a new one."),
        "ETag" => (string(), "The strong entity tag of the object's representation."),
        "Location" => (string(), "The created object's path."),
        "Idempotent-Replayed" => (
            Schema::Object(
                ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["true"])).build(),
            ),
            "`true` when this is the stored answer of an earlier request with the same key.",
        ),
        "Retry-After" => (
            Schema::Object(
                ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[0-9]+$")).build(),
            ),
            "Seconds to wait before retrying (with the same Idempotency-Key).",
        ),
        _ => (string(), ""),
    };
    HeaderBuilder::new().schema(schema).description(Some(description)).build()
}

fn idempotency_key(key: Key, retention_hours: u32) -> utoipa::openapi::path::Parameter {
    let description = match key {
        Key::Required => format!(
            "Required. Names this operation so that it can be retried safely: 1–255 visible ASCII \
             characters (0x21–0x7E), or an RFC 9651 sf-string (`\"…\"`) of printable ASCII; \
             compared case-sensitively, scoped to the account. The same key with the same request \
             replays the stored answer; with another request it is `422`. Kept at least \
             {retention_hours} hours after the answer."
        ),
        Key::Optional => format!(
            "Optional. When sent, the creation is claimed, and its answer stored and replayed \
             byte for byte, the signing secret included: a retry after a lost answer gets the \
             endpoint it made, not a second one. The same key with another body is `422`; kept \
             at least {retention_hours} hours. Without it each request registers an endpoint."
        ),
        Key::Validated | Key::Ignored => format!(
            "Optional. When sent, the request is claimed, stored and replayed exactly like a POST \
             (the same key with another body or media type is `422`), so that a retry after \
             someone else's change does not undo it; kept at least {retention_hours} hours. \
             Without it the patch is applied as sent (use If-Match against lost updates)."
        ),
    };
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(if key == Key::Required { Required::True } else { Required::False })
        .description(Some(description))
        .schema(Some(Schema::Object(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(257))
                .pattern(Some("^[!-~]+$"))
                .build(),
        )))
        .build()
}

fn parameters(param: Param) -> Vec<utoipa::openapi::path::Parameter> {
    let path = |name: &str, prefix: &str, description: &str| {
        ParameterBuilder::new()
            .name(name)
            .parameter_in(ParameterIn::Path)
            .required(Required::True)
            .description(Some(description))
            .schema(Some(Schema::Object(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(format!("^{prefix}")))
                    .build(),
            )))
            .build()
    };
    let query = |name: &str, schema: Schema, description: &str| {
        ParameterBuilder::new()
            .name(name)
            .parameter_in(ParameterIn::Query)
            .required(Required::False)
            .description(Some(description))
            .schema(Some(schema))
            .build()
    };
    match param {
        Param::PaymentId => vec![path("id", "pay_", "The payment, `pay_…`.")],
        Param::RefundId => vec![path("id", "re_", "The refund, `re_…`.")],
        Param::EventId => vec![path("id", "evt_", "The event, `evt_…`.")],
        Param::EndpointId => vec![path("id", "we_", "The webhook endpoint, `we_…`.")],
        Param::EventType => vec![query(
            "type",
            Schema::Object(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(
                        payments_domain::events::EventType::ALL.map(|t| t.to_string()),
                    ))
                    .build(),
            ),
            "Only events of this type.",
        )],
        Param::ProblemCode => vec![
            ParameterBuilder::new()
                .name("code")
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .schema(Some(Schema::Object(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(ProblemCode::ALL.map(ProblemCode::as_str)))
                        .build(),
                )))
                .build(),
        ],
        Param::Page => vec![
            query(
                "limit",
                Schema::Object(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1))
                        .maximum(Some(100))
                        .default(Some(10.into()))
                        .build(),
                ),
                "How many objects, 1 to 100 (default 10).",
            ),
            query("starting_after", string(), "The page after this object id (older objects)."),
            query(
                "ending_before",
                string(),
                "The page before this object id (newer objects); not with `starting_after`.",
            ),
        ],
        Param::StripeSignature => vec![
            ParameterBuilder::new()
                .name("Stripe-Signature")
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(
                    "`t=<unix seconds>,v1=<hex HMAC-SHA256(secret, \"<t>.<body>\")>` with the \
                     endpoint's secret (`processor.webhook_secret`); a timestamp further than \
                     `processor.webhook_tolerance_s` from now is refused as a replay.",
                ))
                .schema(Some(string()))
                .build(),
        ],
        Param::IfMatch => vec![
            ParameterBuilder::new()
                .name("If-Match")
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some(
                    "The ETag the change is based on; `412` if the payment changed since.",
                ))
                .schema(Some(string()))
                .build(),
        ],
    }
}

/// A Stripe event about a charge, as the processor sends it (members beyond these are ignored).
fn processor_event() -> Schema {
    let kinds = payments_domain::processor_events::ChargeEventType::ALL.map(|t| t.to_string());
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("id", ObjectBuilder::new().schema_type(Type::String).pattern(Some("^evt_")))
            .property(
                "object",
                ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["event"])),
            )
            .property(
                "type",
                ObjectBuilder::new().schema_type(Type::String).enum_values(Some(kinds)),
            )
            .property("created", ObjectBuilder::new().schema_type(Type::Integer))
            .property(
                "data",
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .property("object", ObjectBuilder::new().schema_type(Type::Object))
                    .required("object"),
            )
            .property(
                "request",
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .property("idempotency_key", ObjectBuilder::new().schema_type(Type::String)),
            )
            .required("id")
            .required("object")
            .required("type")
            .required("created")
            .required("data")
            .description(Some(
                "`data.object` is the charge right after the change (`id`, `amount`, `currency`, \
                 `captured`, `paid`, `status`, `amount_captured`, `amount_refunded`, `refunded`, \
                 `metadata`); `request.idempotency_key` the key of the request that made it.",
            ))
            .build(),
    )
}

fn string() -> Schema {
    Schema::Object(ObjectBuilder::new().schema_type(Type::String).build())
}

/// `{"object":"list","data":[…],"has_more":…,"url":…}`
fn list(item: &str, url: &str) -> Schema {
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "object",
                ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["list"])),
            )
            .property("data", ArrayBuilder::new().items(Ref::from_schema_name(item)))
            .property("has_more", ObjectBuilder::new().schema_type(Type::Boolean))
            .property(
                "url",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some(format!("`{url}`"))),
            )
            .required("object")
            .required("data")
            .required("has_more")
            .required("url")
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(
                false,
            )))
            .build(),
    )
}

/// RFC 9457 problem details, with the catalogue's codes.
fn problem() -> Schema {
    let text = || ObjectBuilder::new().schema_type(Type::String);
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "RFC 9457 problem details. `code` is stable; `type` links its documentation page. \
                 `card_declined` adds `decline_code` and `payment_id`.",
            ))
            .property("type", text().description(Some("`{base}/problems/{code}`")))
            .property("title", text())
            .property("status", ObjectBuilder::new().schema_type(Type::Integer))
            .property("detail", text())
            .property("code", text().enum_values(Some(ProblemCode::ALL.map(ProblemCode::as_str))))
            .property(
                "param",
                ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                        Type::String,
                        Type::Null,
                    ]))
                    .description(Some("The offending parameter, if one is.")),
            )
            .property(
                "request_id",
                text().description(Some("The id of the request that produced this answer.")),
            )
            .required("type")
            .required("title")
            .required("status")
            .required("detail")
            .required("code")
            .required("request_id")
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn defaults() -> Settings {
        Settings::load_from(Vec::<(String, String)>::new()).unwrap_or_else(|err| panic!("{err}"))
    }

    /// The path templates the router registers, read from its source.
    fn routed_paths() -> BTreeSet<String> {
        let source = include_str!("app.rs");
        let router = &source[source.find("fn router(").unwrap_or(0)..];
        router
            .split(".route(")
            .skip(1)
            .filter_map(|call| call.trim_start().strip_prefix('"')?.split('"').next())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_route_of_the_router_is_documented_and_nothing_else() {
        let routed = routed_paths();
        assert!(routed.len() >= 10, "could not read the router: {routed:?}");
        let documented: BTreeSet<String> = ENDPOINTS.iter().map(|e| e.path.to_owned()).collect();
        assert_eq!(routed, documented);
        let document = serde_json::to_value(document(&defaults(), "http://x")).unwrap_or_default();
        let paths = document["paths"].as_object().cloned().unwrap_or_default();
        assert_eq!(paths.keys().cloned().collect::<BTreeSet<_>>(), documented);
        let operations: usize =
            paths.values().map(|item| item.as_object().map_or(0, |o| o.len())).sum();
        assert_eq!(operations, ENDPOINTS.len(), "one operation per endpoint, none lost in merging");
    }

    #[test]
    fn the_document_is_openapi_3_1_with_every_problem_and_the_retention() {
        let mut settings = defaults();
        settings.idempotency.retention_hours = 36;
        let text = String::from_utf8(json(&settings, "http://127.0.0.1:1")).unwrap_or_default();
        let document: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert!(
            document["openapi"].as_str().unwrap_or_default().starts_with("3.1"),
            "{document:#}"
        );
        assert!(document["info"]["description"].as_str().unwrap_or_default().contains("36 hours"));
        let key = &document["paths"]["/v1/payments"]["post"]["parameters"][0];
        assert_eq!(key["name"], "Idempotency-Key");
        assert_eq!(key["required"], true);
        assert!(key["description"].as_str().unwrap_or_default().contains("36 hours"));
        for schema in
            ["Payment", "Refund", "CreatePaymentRequest", "CreateRefundRequest", "Problem"]
        {
            assert!(document["components"]["schemas"][schema].is_object(), "{schema} missing");
        }
        // Every problem code but the router's own 405 is answered by some operation.
        for code in ProblemCode::ALL {
            if code == ProblemCode::MethodNotAllowed {
                continue;
            }
            assert!(text.contains(&format!("(/problems/{code})")), "{code} is in no response");
        }
        let created = &document["paths"]["/v1/payments"]["post"]["responses"];
        assert!(created["201"]["headers"]["Idempotent-Replayed"].is_object());
        assert!(created["409"]["headers"]["Retry-After"].is_object());
        assert!(created["503"]["headers"]["Retry-After"].is_object());
        assert!(created["429"]["headers"]["Retry-After"].is_object());
    }

    #[test]
    fn the_payment_schema_names_every_member_the_api_sends() {
        let document = serde_json::to_value(document(&defaults(), "http://x")).unwrap_or_default();
        let payment = &document["components"]["schemas"]["Payment"]["properties"];
        let sample = serde_json::json!({
            "id": "pay_1", "object": "payment", "amount": 1, "currency": "usd",
            "status": "succeeded", "capture_method": "automatic", "amount_captured": 1,
            "amount_refunded": 0, "refunded": false, "payment_method": "pm_card_visa",
            "description": null, "metadata": {}, "receipt_email": null,
            "processor_charge_id": null, "failure_code": null, "failure_message": null,
            "cancellation_reason": null, "created": 0, "livemode": false
        });
        for member in
            sample.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default()
        {
            assert!(payment[&member].is_object(), "Payment lacks {member}: {payment:#}");
        }
    }
}
