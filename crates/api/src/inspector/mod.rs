//! `/inspector`: a read-only web page of what the idempotency engine is doing, for operators and
//! for anyone studying the design. Server-rendered HTML with a little CSS, no scripts.
//!
//! - `/inspector`: recent keys per account (recovery point, lease, attempts, stored status, age),
//!   keys waiting for a person, staged and dead jobs, webhook deliveries, receipts;
//! - `/inspector/keys/{id}`: one key's state diagram (its operation's recovery points, the path
//!   it took, where it stands now, with a legend linked to the guide) beside its timeline: the
//!   claim, every later attempt (a retry that resumed or took over, or the completer), every phase
//!   commit and processor call (with its derived downstream key) from the audit records; and the
//!   stored answer, byte for byte.
//!
//! Off unless `inspector.enabled`; every page asks for the operator token (`inspector.token`),
//! given once as `?token=…` (which sets an HttpOnly cookie) or as `Authorization: Bearer …`.
//! It shows no secret key, no token of the processor, and payment methods only masked. A page
//! about a key still in flight refreshes itself every two seconds.
//!
//! This module holds the routes and the operator check; the pages are `templates`, the diagram
//! `diagram`, its legend `legend`, the stored answer's masking `body`. The data
//! comes from the tables' owners: `idem::inspect` for the keys and their attempts, the domain's
//! modules for the rest.

mod body;
mod diagram;
mod legend;
mod templates;

use axum::Router;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use idem::inspect;
use maud::Markup;
use payments_domain::{AccountId, accounts, audit, jobs, receipts, webhooks};
use payments_settings::ExposeSecret as _;
use sha2::{Digest, Sha256};

use crate::app::AppState;

/// The cookie that carries the operator token after `?token=…`.
const COOKIE: &str = "payments_inspector";
/// Accounts shown on the overview (the first by name).
const ACCOUNTS: i64 = 50;
/// Keys shown per account on the overview.
const KEYS_PER_ACCOUNT: i64 = 20;
/// Keys waiting for a person shown on the overview.
const FLAGGED: i64 = 50;

/// The inspector's routes; `app` mounts them only when `inspector.enabled`.
pub fn router() -> Router<AppState> {
    Router::new().route("/inspector", get(overview)).route("/inspector/keys/{id}", get(key_page))
}

/// An operator who presented the token.
#[derive(Debug)]
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let expected = Sha256::digest(state.settings.inspector.token.expose_secret().as_bytes());
        let matches = |presented: &str| Sha256::digest(presented.as_bytes()) == expected;
        let query_token = parts.uri.query().and_then(|q| {
            form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v)
        });
        if let Some(token) = query_token {
            if !matches(&token) {
                return Err(login(true));
            }
            // Trade the token in the URL for a cookie, and drop it from the address bar.
            let cookie = format!("{COOKIE}={token}; Path=/inspector; HttpOnly; SameSite=Strict");
            let mut response = Redirect::to(parts.uri.path()).into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            return Err(response);
        }
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='));
        match bearer.or(cookie) {
            Some(token) if matches(token) => Ok(Operator),
            Some(_) => Err(login(true)),
            None => Err(login(false)),
        }
    }
}

/// The 401 page: a form that asks for the token.
fn login(wrong: bool) -> Response {
    let mut response = html(StatusCode::UNAUTHORIZED, templates::login(wrong));
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// `GET /inspector`
async fn overview(_: Operator, State(state): State<AppState>) -> Result<Response, Response> {
    let pool = &state.pool;
    let accounts = accounts::first_by_name(pool, ACCOUNTS).await.map_err(unavailable)?;
    let ids: Vec<String> = accounts.iter().map(|a| a.id.as_str().to_owned()).collect();
    let keys =
        inspect::key_lists(pool, &ids, KEYS_PER_ACCOUNT, FLAGGED).await.map_err(unavailable)?;
    let jobs = jobs::pending(pool, 50).await.map_err(unavailable)?;
    let deliveries = webhooks::recent_deliveries(pool, 30).await.map_err(unavailable)?;
    let receipts = receipts::recent(pool, 20).await.map_err(unavailable)?;
    let page = templates::overview(&templates::Overview {
        accounts: &accounts,
        keys: &keys,
        jobs: &jobs,
        deliveries: &deliveries,
        receipts: &receipts,
    });
    Ok(html(StatusCode::OK, page))
}

/// `GET /inspector/keys/{id}`
async fn key_page(
    _: Operator,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, Response> {
    let Ok(id) = id.parse::<i64>() else {
        return Err(not_found());
    };
    let pool = &state.pool;
    let key = inspect::key_detail(pool, id).await.map_err(unavailable)?.ok_or_else(not_found)?;
    // The engine stores its keys' accounts as text; one that is no account id names no account.
    let account_name = match AccountId::parse(&key.account_id) {
        Ok(account) => accounts::name(pool, &account).await.map_err(unavailable)?,
        Err(_) => None,
    };
    let attempts = inspect::attempts(pool, id).await.map_err(unavailable)?;
    let events = audit::for_key(pool, id).await.map_err(unavailable)?;
    let page = templates::key_page(&templates::KeyPage {
        key: &key,
        account_name: account_name.as_deref().unwrap_or("(no such account)"),
        attempts: &attempts,
        events: &events,
        docs_base_url: &state.settings.inspector.docs_base_url,
    });
    Ok(html(StatusCode::OK, page))
}

fn html(status: StatusCode, page: Markup) -> Response {
    let mut response = (status, page.into_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn not_found() -> Response {
    html(StatusCode::NOT_FOUND, templates::not_found())
}

fn unavailable(err: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %err, "the inspector could not read the database");
    html(StatusCode::SERVICE_UNAVAILABLE, templates::unavailable())
}
