//! The parameters operations share, each described once, as types an annotation names:
//! `params(param::PaymentId, param::IdempotencyKey)`.
//!
//! The descriptions of the `Idempotency-Key` mention the retention, a setting: they say
//! `{retention_hours}`, which `super::document` fills in when it renders the document.

use utoipa::IntoParams;
use utoipa::openapi::Required;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

use super::schemas::string;
use crate::error::ProblemCode;

/// What `super::document` replaces with `idempotency.retention_hours`.
pub(super) const RETENTION_HOURS: &str = "{retention_hours}";
/// What `super::document` replaces with `retention.events_days`, in an operation's description.
pub(super) const EVENTS_DAYS: &str = "{events_days}";

/// Implements `IntoParams` for a unit type from a function that builds its parameters.
macro_rules! params {
    ($($(#[$doc:meta])* $name:ident => $build:expr;)+) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name;

        impl IntoParams for $name {
            fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
                $build
            }
        }
    )+};
}

params! {
    /// `{id}` of a payment.
    PaymentId => vec![path_id("pay_", "The payment, `pay_…`.")];
    /// `{id}` of a refund.
    RefundId => vec![path_id("re_", "The refund, `re_…`.")];
    /// `{id}` of an event.
    EventId => vec![path_id("evt_", "The event, `evt_…`.")];
    /// `{id}` of a webhook endpoint.
    EndpointId => vec![path_id("we_", "The webhook endpoint, `we_…`.")];
    /// `{code}` of a problem: one of the catalogue's.
    Code => vec![
        ParameterBuilder::new()
            .name("code")
            .parameter_in(ParameterIn::Path)
            .required(Required::True)
            .schema(Some(enumeration(ProblemCode::ALL.map(ProblemCode::as_str))))
            .build(),
    ];
    /// `limit`, `starting_after`, `ending_before` of a list.
    Page => page();
    /// `type` of `GET /v1/events`.
    EventType => vec![query(
        "type",
        enumeration(
            payments_domain::events::EventType::ALL.map(|t| t.to_string()),
        ),
        "Only events of this type.",
    )];
    /// `If-Match` of a payment's update.
    IfMatch => vec![header(
        "If-Match",
        Required::False,
        "The ETag the change is based on; `412` if the payment changed since.",
    )];
    /// `Stripe-Signature` of the processor's webhooks.
    StripeSignature => vec![header(
        "Stripe-Signature",
        Required::True,
        "`t=<unix seconds>,v1=<hex HMAC-SHA256(secret, \"<t>.<body>\")>` with the endpoint's \
         secret (`processor.webhook_secret`); a timestamp further than \
         `processor.webhook_tolerance_s` from now is refused as a replay.",
    )];
    /// The `Idempotency-Key` every request of the operation must carry; the answer is stored and
    /// replayed.
    IdempotencyKey => vec![idempotency_key(
        Required::True,
        "Required. Names this operation so that it can be retried safely: 1–255 visible ASCII \
         characters (0x21–0x7E), or an RFC 9651 sf-string (`\"…\"`) of printable ASCII; \
         compared case-sensitively, scoped to the account. The same key with the same request \
         replays the stored answer; with another request it is `422`. Kept at least \
         {retention_hours} hours after the answer.",
    )];
    /// A creation's optional `Idempotency-Key`: with it, the request is claimed and its answer
    /// stored and replayed; without it, each request acts.
    CreationKey => vec![idempotency_key(
        Required::False,
        "Optional. When sent, the creation is claimed, and its answer stored and replayed \
         byte for byte, the signing secret included: a retry after a lost answer gets the \
         endpoint it made, not a second one. The same key with another body is `422`; kept \
         at least {retention_hours} hours. Without it each request registers an endpoint.",
    )];
    /// An endpoint update's optional `Idempotency-Key`.
    UpdateKey => vec![idempotency_key(
        Required::False,
        "Optional. When sent, the update is claimed, stored and replayed like a creation (the \
         same key with another body, or on another registered endpoint, is `422`), so that a retry after a lost answer \
         does not set the status again over someone else's change; kept at least \
         {retention_hours} hours. An id never registered is `404` and stores nothing; a deleted \
         endpoint's `404` is the key's answer. Without it the status is set as sent.",
    )];
    /// A patch's optional `Idempotency-Key` (PATCH is idempotent by nature; the key makes a
    /// retry replay instead of applying the patch again).
    PatchKey => vec![idempotency_key(
        Required::False,
        "Optional. When sent, the request is claimed, stored and replayed exactly like a POST \
         (the same key with another body, media type or If-Match is `422`), so that a retry after \
         someone else's change does not undo it; kept at least {retention_hours} hours. \
         Without it the patch is applied as sent (use If-Match against lost updates).",
    )];
}

fn path_id(prefix: &str, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name("id")
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
}

fn query(name: &str, schema: Schema, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Query)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

fn header(name: &str, required: Required, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(required)
        .description(Some(description))
        .schema(Some(string()))
        .build()
}

fn enumeration<V: Into<serde_json::Value>>(values: impl IntoIterator<Item = V>) -> Schema {
    Schema::Object(ObjectBuilder::new().schema_type(Type::String).enum_values(Some(values)).build())
}

fn page() -> Vec<Parameter> {
    let limit = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(1))
        .maximum(Some(crate::routes::lists::LIST_LIMIT_MAX))
        .default(Some(crate::routes::lists::LIST_LIMIT_DEFAULT.into()))
        .build();
    vec![
        query("limit", Schema::Object(limit), "How many objects, 1 to 100 (default 10)."),
        query("starting_after", string(), "The page after this object id (older objects)."),
        query(
            "ending_before",
            string(),
            "The page before this object id (newer objects); not with `starting_after`.",
        ),
    ]
}

fn idempotency_key(required: Required, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(required)
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
