//! The response headers the API sends, each described once.
//!
//! An operation's annotation names the headers of its success response
//! (`headers(("ETag"), ("Idempotent-Replayed"))`); `describe` gives each its schema and
//! description here, and adds `Request-Id`, which every answer carries (`crate::edge`).

use utoipa::openapi::header::{Header, HeaderBuilder};
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

use super::schemas::string;

/// Gives every header of the operation's responses its shared description, and adds `Request-Id`.
pub(super) fn describe(operation: &mut Operation) {
    for response in operation.responses.responses.values_mut() {
        let utoipa::openapi::RefOr::T(response) = response else { continue };
        for (name, header) in &mut response.headers {
            if let Some(described) = named(name) {
                *header = described;
            }
        }
        response.headers.insert("Request-Id".to_owned(), request_id());
    }
}

/// The description of a header the API sends, by name; `None` for a name it does not know.
pub(super) fn named(name: &str) -> Option<Header> {
    match name {
        "Request-Id" => Some(request_id()),
        "ETag" => Some(text("The strong entity tag of the object's representation.")),
        "Location" => Some(text("The created object's path.")),
        "Idempotent-Replayed" => Some(idempotent_replayed()),
        "Retry-After" => Some(retry_after()),
        _ => None,
    }
}

fn request_id() -> Header {
    text("This request's id (`req_…`); a replay gets a new one.")
}

/// `Idempotent-Replayed: true`.
pub(super) fn idempotent_replayed() -> Header {
    header(
        Schema::Object(
            ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["true"])).build(),
        ),
        "`true` when this is the stored answer of an earlier request with the same key.",
    )
}

/// `Retry-After`, in whole seconds.
pub(super) fn retry_after() -> Header {
    header(
        Schema::Object(
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[0-9]+$")).build(),
        ),
        "Seconds to wait before retrying (with the same Idempotency-Key).",
    )
}

fn text(description: &str) -> Header {
    header(string(), description)
}

fn header(schema: Schema, description: &str) -> Header {
    HeaderBuilder::new().schema(schema).description(Some(description)).build()
}
