//! The schemas no struct of ours derives: the lists, the problem details, the processor's event.
//!
//! The objects' own schemas (`Payment`, `Refund`, the request bodies, …) are derived (utoipa)
//! from the very structs that serialize and parse them, and collected from the annotations that
//! name them. These are written by hand because the bytes they describe are not one struct's: a
//! list's items are the objects' stored representations, a problem is rendered by the edge, and
//! the processor's event is parsed member by member after its signature is checked.

use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::error::ProblemCode;

/// Declares a unit type whose schema is the given expression, under its own name.
macro_rules! schema {
    ($($(#[$doc:meta])* $name:ident => $schema:expr;)+) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                RefOr::T($schema)
            }
        }

        impl ToSchema for $name {}
    )+};
}

schema! {
    /// `GET /v1/payments`
    PaymentList => list("Payment", "/v1/payments");
    /// `GET /v1/payments/{id}/refunds`
    RefundList => list("Refund", "/v1/payments/{id}/refunds");
    /// `GET /v1/events`
    EventList => list("Event", "/v1/events");
    /// `GET /v1/webhook_endpoints`
    WebhookEndpointList => list("WebhookEndpoint", "/v1/webhook_endpoints");
    /// RFC 9457 problem details, with the catalogue's codes.
    Problem => problem();
    /// A Stripe event about a charge, as the processor sends it (members beyond these are
    /// ignored).
    ProcessorEvent => processor_event();
}

/// `{"type": "string"}`
pub(super) fn string() -> Schema {
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
            .additional_properties(Some(AdditionalProperties::FreeForm(false)))
            .build(),
    )
}

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
                    .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
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

fn processor_event() -> Schema {
    let kinds = payments_domain::processor_events::ProcessorEventType::ALL.map(|t| t.to_string());
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
