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
//! posted once from the login form (`POST /inspector/login`, which sets an `HttpOnly; Secure;
//! SameSite=Strict` session cookie) or sent as `Authorization: Bearer …`, never read from a URL;
//! wrong tokens are limited per source and in all (`guesses`). It shows no secret key, no token
//! of the processor, no webhook secret, and payment methods only masked. A page about a key
//! still in flight refreshes itself every two seconds.
//!
//! This module holds the routes; the login and the operator check are `login`, the bound on
//! wrong tokens `guesses`, the pages `templates`, the diagram `diagram`, its legend `legend`, the
//! stored answer's masking `body`. The data
//! comes from the tables' owners: `idem::inspect` for the keys and their attempts, the domain's
//! modules for the rest.

mod body;
mod diagram;
mod guesses;
mod legend;
mod login;
mod templates;

pub use guesses::Guesses;
pub use login::{COOKIE, Operator, SESSION};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem::inspect;
use maud::Markup;
use payments_domain::{AccountId, accounts, audit, jobs, receipts, webhooks};

use crate::app::AppState;
/// Accounts shown on the overview (the first by name).
const ACCOUNTS: i64 = 50;
/// Keys shown per account on the overview.
const KEYS_PER_ACCOUNT: i64 = 20;
/// Keys waiting for a person shown on the overview.
const FLAGGED: i64 = 50;

/// The inspector's routes; `app` mounts them only when `inspector.enabled`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/inspector", get(overview))
        .route("/inspector/login", post(login::login))
        .route("/inspector/keys/{id}", get(key_page))
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
