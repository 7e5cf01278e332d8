//! `GET /problems/{code}`: a page for people about each problem type, the target of every problem
//! body's `type` link.

use axum::extract::Path;
use axum::response::Html;
use utoipa_axum::routes;

use crate::error::{ApiError, ProblemCode};
use crate::openapi::{ApiRouter, OK, Problems, Public, code, param};

/// This module's routes: each handler's path and method are in its `#[utoipa::path]`.
pub fn routes(api: ApiRouter) -> ApiRouter {
    api.routes(routes!(show))
}

/// The documentation page of one problem code.
#[utoipa::path(
    get,
    path = "/problems/{code}",
    operation_id = "problem",
    tag = "operations",
    summary = "The documentation page of a problem type",
    params(param::Code),
    responses(
        (status = 200, description = OK, body = String, content_type = "text/html"),
        Problems<Public, (code::ResourceMissing,)>,
    )
)]
pub async fn show(Path(code): Path<String>) -> Result<Html<String>, ApiError> {
    let code = ProblemCode::parse(&code).ok_or_else(|| {
        ApiError::resource_missing(format!("No problem type is called `{code}`."))
    })?;
    let doc = code.doc();
    Ok(Html(format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         <style>body{{font:16px/1.5 system-ui,sans-serif;max-width:42rem;margin:2rem auto;padding:0 1rem}}\
         code{{background:#f3f3f3;padding:0 .2em}}dt{{font-weight:600}}</style></head><body>\
         <h1>{title}</h1><p><code>{code}</code> &middot; HTTP {status}</p>\
         <dl><dt>What happened</dt><dd>{description}</dd>\
         <dt>What to do</dt><dd>{remedy}</dd>\
         <dt>Stored against the Idempotency-Key and replayed?</dt><dd>{stored}</dd></dl>\
         </body></html>\n",
        title = doc.code.title(),
        code = doc.code.as_str(),
        status = doc.code.status(),
        description = html_escape(doc.description),
        remedy = html_escape(doc.remedy),
        stored = html_escape(doc.stored_for_replay),
    )))
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
