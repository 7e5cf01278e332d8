//! The operator's login to the inspector: the token is posted once, from the login form, and
//! traded for a session cookie; scripts may send it as `Authorization: Bearer …` instead. A token
//! in a URL (`?token=…`) is not read: it would sit in the browser's history, in proxies' logs and
//! in `Referer` headers.
//!
//! The cookie holds no token: it is `<issued unix seconds>.<HMAC-SHA256 of them under the
//! token>`, good for [`SESSION`] (changing the token ends every session), and it is
//! `HttpOnly; Secure; SameSite=Strict` on `Path=/inspector`. Browsers keep a `Secure` cookie
//! that `http://localhost` or `http://127.0.0.1` set (they count loopback as a secure context),
//! so local runs over plain HTTP work; anywhere else the inspector must be served over HTTPS,
//! or the browser drops the cookie and every page asks for the token again.
//!
//! Every credential presented (the posted token, a Bearer token, a cookie) counts against the
//! source's and the server's budget of wrong ones ([`Guesses`](super::guesses::Guesses)); the
//! token is compared through SHA-256 digests and the cookie's MAC by `hmac`'s constant-time
//! check, so a comparison tells nothing by its timing.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Extension, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use payments_settings::ExposeSecret as _;
use sha2::{Digest, Sha256};

use super::{html, templates};
use crate::app::AppState;
use crate::limits::{ClientAddress, SourceKey};

/// The cookie that carries an operator's session.
pub const COOKIE: &str = "payments_inspector";
/// How long a session lasts.
pub const SESSION: Duration = Duration::from_secs(12 * 3600);

/// An operator who presented the token, or a session it opened.
#[derive(Debug)]
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let source = parts.extensions.get::<ClientAddress>().map(|client| client.source());
        let token = state.settings.inspector.token.expose_secret();
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = session_cookie(&parts.headers);
        let here = parts.uri.path().to_owned();
        let (accepted, presented_cookie) = match (bearer, cookie) {
            (Some(bearer), _) => {
                (guarded(state, source, || same_token(bearer, token)).map_err(too_many)?, false)
            }
            (None, Some(cookie)) => {
                let now = unix_now();
                let holds = guarded(state, source, || session_holds(cookie, token, now));
                (holds.map_err(too_many)?, true)
            }
            (None, None) => return Err(login_page(StatusCode::UNAUTHORIZED, false, &here)),
        };
        if accepted {
            return Ok(Operator);
        }
        let mut refused = login_page(StatusCode::UNAUTHORIZED, true, &here);
        if presented_cookie {
            // A session of another token, or forged: the browser stops sending it.
            let gone =
                format!("{COOKIE}=; Path=/inspector; Max-Age=0; HttpOnly; Secure; SameSite=Strict");
            if let Ok(value) = HeaderValue::from_str(&gone) {
                refused.headers_mut().insert(header::SET_COOKIE, value);
            }
        }
        Err(refused)
    }
}

/// `POST /inspector/login`: the form's `token` (and `next`, the inspector's page to go back to).
/// The right token answers `303` to that page with the session cookie; a wrong one the form
/// again, `401`; a source or server out of guesses `429` with `Retry-After`.
pub async fn login(
    State(state): State<AppState>,
    client: Option<Extension<ClientAddress>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let source = client.map(|Extension(client)| client.source());
    let form = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let is_form = form.is_some_and(|v| {
        v.split(';').next().is_some_and(|essence| {
            essence.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
    });
    let (mut presented, mut next) = (None, None);
    if is_form {
        for (name, value) in form_urlencoded::parse(&body) {
            match &*name {
                "token" => presented = Some(value.into_owned()),
                "next" => next = Some(value.into_owned()),
                _ => {}
            }
        }
    }
    let next = next.filter(|path| is_inspector_page(path)).unwrap_or_else(|| "/inspector".into());
    let Some(presented) = presented.filter(|token| !token.is_empty()) else {
        return login_page(StatusCode::BAD_REQUEST, false, &next);
    };
    let token = state.settings.inspector.token.expose_secret();
    match guarded(&state, source, || same_token(&presented, token)) {
        Err(wait) => too_many(wait),
        Ok(false) => login_page(StatusCode::UNAUTHORIZED, true, &next),
        Ok(true) => {
            let cookie = format!(
                "{COOKIE}={}; Path=/inspector; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
                session(token, unix_now()),
                SESSION.as_secs()
            );
            let mut response = Redirect::to(&next).into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
    }
}

/// `check`'s verdict on a credential from `source`, counted: a wrong one against the budget,
/// the right one clearing the source's failures; or, for a source or server out of guesses, how
/// long to wait, before `check` runs.
fn guarded(
    state: &AppState,
    source: Option<SourceKey>,
    check: impl FnOnce() -> bool,
) -> Result<bool, Duration> {
    let now = Instant::now();
    let guesses = &state.inspector_guesses;
    guesses.admit(source, now)?;
    let accepted = check();
    if accepted {
        guesses.succeeded(source);
    } else {
        guesses.failed(source, now);
        tracing::warn!(source = ?source, "a wrong inspector credential");
    }
    Ok(accepted)
}

/// Whether `presented` is the operator token (an empty token never is).
fn same_token(presented: &str, token: &str) -> bool {
    !token.is_empty() && Sha256::digest(presented.as_bytes()) == Sha256::digest(token.as_bytes())
}

/// The session cookie's value for a session opened at `issued` (Unix seconds) under `token`.
fn session(token: &str, issued: u64) -> String {
    format!(
        "{issued}.{}",
        URL_SAFE_NO_PAD.encode(session_mac(token, issued).finalize().into_bytes())
    )
}

fn session_mac(token: &str, issued: u64) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(b"payments inspector session\0");
    mac.update(issued.to_string().as_bytes());
    mac
}

/// Whether `cookie` is a session `token` opened, still young at `now` (Unix seconds).
fn session_holds(cookie: &str, token: &str, now: u64) -> bool {
    let Some((issued, tag)) = cookie.split_once('.') else { return false };
    let (Ok(issued), Ok(tag)) = (issued.parse::<u64>(), URL_SAFE_NO_PAD.decode(tag)) else {
        return false;
    };
    let young = issued <= now.saturating_add(60) && now.saturating_sub(issued) < SESSION.as_secs();
    !token.is_empty() && session_mac(token, issued).verify_slice(&tag).is_ok() && young
}

/// The session cookie a request carries, if any.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|value| !value.is_empty())
}

/// Whether `path` is one of the inspector's pages (where a login may send the browser back to).
fn is_inspector_page(path: &str) -> bool {
    (path == "/inspector" || path.starts_with("/inspector/"))
        && path.bytes().all(|b| b.is_ascii_alphanumeric() || b"/_-".contains(&b))
}

/// The login form, which posts to `/inspector/login` and comes back to `next`.
fn login_page(status: StatusCode, wrong: bool, next: &str) -> Response {
    let next = if is_inspector_page(next) { next } else { "/inspector" };
    let mut response = html(status, templates::login(wrong, next));
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// `429`: out of guesses for `wait`.
fn too_many(wait: Duration) -> Response {
    let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
    let mut response = html(StatusCode::TOO_MANY_REQUESTS, templates::too_many_guesses(seconds));
    if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TOKEN: &str = "operator-token-0123456789";

    #[test]
    fn a_session_holds_for_its_token_while_it_is_young() {
        let issued = 1_700_000_000;
        let cookie = session(TOKEN, issued);
        assert!(!cookie.contains(TOKEN), "{cookie}");
        assert!(session_holds(&cookie, TOKEN, issued + 10));
        assert!(!session_holds(&cookie, "another-token-0123456789", issued + 10));
        assert!(!session_holds(&cookie, TOKEN, issued + SESSION.as_secs()), "too old");
        assert!(!session_holds(&cookie, TOKEN, issued - 3600), "from the future");
        let (_, tag) = cookie.split_once('.').unwrap();
        let moved = format!("{}.{tag}", issued + 3600);
        assert!(!session_holds(&moved, TOKEN, issued + 3600), "its time is authenticated");
        for garbage in ["", ".", "abc", "1.", "1.!!"] {
            assert!(!session_holds(garbage, TOKEN, issued), "{garbage:?}");
        }
        assert!(!session_holds(&session("", issued), "", issued), "no token, no session");
    }

    #[test]
    fn only_the_inspectors_own_pages_are_gone_back_to() {
        for page in ["/inspector", "/inspector/keys/42"] {
            assert!(is_inspector_page(page), "{page}");
        }
        for elsewhere in [
            "/",
            "//evil.example/inspector",
            "https://evil.example",
            "/inspectors",
            "/inspector/../v1/payments",
            "/inspector?x=1",
            "/inspector/\\evil",
        ] {
            assert!(!is_inspector_page(elsewhere), "{elsewhere}");
        }
    }
}
