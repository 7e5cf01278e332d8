//! What every list endpoint shares: the page parameters (`limit`, `starting_after`,
//! `ending_before`), checked before any query, and the list shape it answers with.

use axum::Json;
use axum::response::{IntoResponse, Response};
use payments_domain::ids::{self, ObjectId};
use payments_domain::payments::Cursor;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::ApiError;

/// The largest page a list returns.
pub const LIST_LIMIT_MAX: u32 = 100;
/// The page size when none is asked for.
pub const LIST_LIMIT_DEFAULT: u32 = 10;

/// Pagination parameters shared by every list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Page size, 1 to 100.
    pub limit: Option<u32>,
    /// Return objects older than this id.
    pub starting_after: Option<String>,
    /// Return objects newer than this id.
    pub ending_before: Option<String>,
}

/// A validated page request over objects with ids of type `Id`.
#[derive(Debug)]
pub struct Page<Id> {
    /// How many objects at most.
    pub limit: i64,
    /// Where the page starts.
    pub cursor: Option<Cursor<Id>>,
}

impl<Id> Page<Id> {
    /// The parameter that named the cursor, for a 404 about it.
    pub fn cursor_param(&self) -> Option<&'static str> {
        match self.cursor {
            Some(Cursor::After(_)) => Some("starting_after"),
            Some(Cursor::Before(_)) => Some("ending_before"),
            None => None,
        }
    }
}

impl ListParams {
    /// Checks the parameters; a cursor must be an id of the listed objects (`Id`).
    pub fn validate<Id: ObjectId>(self) -> Result<Page<Id>, ApiError> {
        let limit = self.limit.unwrap_or(LIST_LIMIT_DEFAULT);
        if !(1..=LIST_LIMIT_MAX).contains(&limit) {
            return Err(ApiError::invalid_request(
                "limit",
                format!("`limit` must be between 1 and {LIST_LIMIT_MAX}."),
            ));
        }
        let cursor = match (self.starting_after, self.ending_before) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid_request(
                    "ending_before",
                    "`starting_after` and `ending_before` cannot be used together.",
                ));
            }
            (Some(id), None) => Some(Cursor::After(check_cursor("starting_after", &id)?)),
            (None, Some(id)) => Some(Cursor::Before(check_cursor("ending_before", &id)?)),
            (None, None) => None,
        };
        Ok(Page { limit: i64::from(limit), cursor })
    }
}

fn check_cursor<Id: ObjectId>(param: &'static str, id: &str) -> Result<Id, ApiError> {
    // Checked before any query: a cursor of the wrong shape (a NUL, say) is the client's error.
    Id::parse(id).map_err(|_| {
        ApiError::invalid_request(
            param,
            format!(
                "`{param}` must be an id: `{}_` and up to {} letters or digits.",
                Id::PREFIX,
                ids::ID_MAX_SUFFIX_CHARS
            ),
        )
    })
}

/// The list shape every list endpoint answers with.
#[derive(Debug, Serialize)]
pub struct List {
    /// Always `"list"`.
    pub object: &'static str,
    /// The page, newest first, each object in its own representation.
    pub data: Vec<Box<RawValue>>,
    /// Whether more objects lie beyond the page.
    pub has_more: bool,
    /// The list's own path.
    pub url: String,
}

/// Objects' representations as they are, for a list.
pub fn raw_items(items: impl Iterator<Item = Vec<u8>>) -> Result<Vec<Box<RawValue>>, ApiError> {
    items
        .map(|bytes| {
            let text = String::from_utf8(bytes).map_err(|err| ApiError::internal(&err))?;
            RawValue::from_string(text).map_err(|err| ApiError::internal(&err))
        })
        .collect()
}

/// The 404 for a cursor that names no object of the list.
pub fn cursor_missing<Id: ObjectId>(page: &Page<Id>, what: &str) -> ApiError {
    let id = match &page.cursor {
        Some(Cursor::After(id) | Cursor::Before(id)) => id.as_ref(),
        None => "",
    };
    let error = ApiError::resource_missing(format!("No such {what}: '{id}'."));
    match page.cursor_param() {
        Some(param) => error.with_param(param),
        None => error,
    }
}

impl IntoResponse for List {
    fn into_response(self) -> Response {
        Json(self).into_response()
    }
}
