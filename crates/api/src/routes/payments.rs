//! `/v1/payments`.

use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::auth::Authenticated;
use crate::error::ApiError;
use crate::extract::ApiQuery;

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

/// A validated page request.
#[derive(Debug)]
pub struct Page {
    /// How many objects at most.
    pub limit: u32,
    /// Where the page starts.
    pub cursor: Option<Cursor>,
}

/// Which side of an object the page lies on.
#[derive(Debug)]
pub enum Cursor {
    /// Objects created before this one.
    After(String),
    /// Objects created after this one.
    Before(String),
}

impl ListParams {
    /// Checks the parameters; `prefix` is the id prefix of the listed objects (`pay_`).
    pub fn validate(self, prefix: &str) -> Result<Page, ApiError> {
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
            (Some(id), None) => Some(Cursor::After(check_cursor("starting_after", id, prefix)?)),
            (None, Some(id)) => Some(Cursor::Before(check_cursor("ending_before", id, prefix)?)),
            (None, None) => None,
        };
        Ok(Page { limit, cursor })
    }
}

fn check_cursor(param: &'static str, id: String, prefix: &str) -> Result<String, ApiError> {
    if id.starts_with(prefix) && id.len() > prefix.len() {
        Ok(id)
    } else {
        Err(ApiError::invalid_request(
            param,
            format!("`{param}` must be an id starting with `{prefix}`."),
        ))
    }
}

/// The list shape every list endpoint answers with.
#[derive(Debug, Serialize)]
pub struct List<T> {
    /// Always `"list"`.
    pub object: &'static str,
    /// The page, newest first.
    pub data: Vec<T>,
    /// Whether more objects lie beyond the page.
    pub has_more: bool,
    /// The list's own path.
    pub url: &'static str,
}

/// `GET /v1/payments`. No payment can exist until payments are created, so the page is empty;
/// a cursor must name an existing payment, so any cursor is unknown.
pub async fn list(
    Authenticated(_account): Authenticated,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List<Value>>, ApiError> {
    let page = params.validate("pay_")?;
    if let Some(Cursor::After(id) | Cursor::Before(id)) = &page.cursor {
        let param = match page.cursor {
            Some(Cursor::After(_)) => "starting_after",
            _ => "ending_before",
        };
        return Err(
            ApiError::resource_missing(format!("No such payment: '{id}'.")).with_param(param)
        );
    }
    Ok(Json(List { object: "list", data: Vec::new(), has_more: false, url: "/v1/payments" }))
}
