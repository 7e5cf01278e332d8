//! `/inspector`: a read-only web page of what the idempotency engine is doing, for operators and
//! for anyone studying the design. Server-rendered HTML with a little CSS, no scripts.
//!
//! - `/inspector`: recent keys per account (recovery point, lease, attempts, stored status, age),
//!   keys waiting for a person, staged and dead jobs, webhook deliveries, receipts;
//! - `/inspector/keys/{id}`: one key's timeline: the claim, every later attempt (a retry that
//!   resumed or took over, or the completer), every phase commit and processor call (with its
//!   derived downstream key) from the audit records, and the stored answer.
//!
//! Off unless `inspector.enabled`; every page asks for the operator token (`inspector.token`),
//! given once as `?token=…` (which sets an HttpOnly cookie) or as `Authorization: Bearer …`.
//! It shows no secret key, no token of the processor, and payment methods only masked. A page
//! about a key still in flight refreshes itself every two seconds.

use std::fmt::Write as _;

use axum::Router;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use payments_settings::ExposeSecret as _;
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::app::AppState;

/// The cookie that carries the operator token after `?token=…`.
const COOKIE: &str = "payments_inspector";
/// Keys shown per account on the overview.
const KEYS_PER_ACCOUNT: i64 = 20;

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
    let mut body = page_start("Inspector: operator token required", false);
    body.push_str("<h1>Operator token required</h1>");
    if wrong {
        body.push_str("<p class=\"bad\">That token is not the operator token.</p>");
    }
    body.push_str(
        "<p>This page shows the server's idempotency keys. Enter the operator token \
         (<code>inspector.token</code>; <code>make run</code> prints it).</p>\
         <form method=\"get\"><input type=\"password\" name=\"token\" autocomplete=\"off\" \
         aria-label=\"operator token\"> <button type=\"submit\">Open</button></form>",
    );
    let mut response = html(StatusCode::UNAUTHORIZED, body);
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// `GET /inspector`
async fn overview(_: Operator, State(state): State<AppState>) -> Result<Response, Response> {
    let pool = &state.pool;
    // One statement for both key lists: the recent keys of each account (in account order), then
    // the keys waiting for a person (most recently flagged first). A key can be in both.
    let lines = sqlx::query_as!(
        KeyLine,
        r#"
        WITH recent AS (
            SELECT k.id, row_number() OVER (ORDER BY a.name, a.id, k.id DESC) AS n
              FROM (SELECT id, name FROM accounts ORDER BY name, id LIMIT 50) a
              CROSS JOIN LATERAL (
                    SELECT id FROM idempotency_keys k
                     WHERE k.account_id = a.id ORDER BY k.id DESC LIMIT $1) k
        ), flagged AS (
            SELECT id, row_number() OVER (ORDER BY needs_human_at DESC) AS n
              FROM idempotency_keys WHERE needs_human_at IS NOT NULL
             ORDER BY needs_human_at DESC LIMIT 50
        ), listed AS (
            SELECT false AS waiting_list, id, n FROM recent
            UNION ALL
            SELECT true, id, n FROM flagged
        )
        SELECT l.waiting_list AS "waiting_list!",
               a.name AS "account_name!", k.account_id AS "account_id!", k.id AS "id!",
               k.idempotency_key AS "key!", k.operation AS "operation!",
               k.request_method AS "method!", k.request_path AS "path!",
               k.recovery_point AS "recovery_point!", k.owner_token AS "owner_token?",
               k.attempts AS "attempts!",
               to_char(k.locked_until AT TIME ZONE 'UTC', 'HH24:MI:SS') AS "lease_until?",
               coalesce(k.locked_until > now(), false) AS "lease_active!",
               k.response_status AS "response_status?", k.completed_at IS NOT NULL AS "finished!",
               k.needs_human_at IS NOT NULL AS "flagged!", k.last_error AS "last_error?",
               extract(epoch FROM now() - k.created_at)::float8 AS "age_s!"
          FROM listed l
          JOIN idempotency_keys k ON k.id = l.id
          JOIN accounts a ON a.id = k.account_id
         ORDER BY l.waiting_list, l.n
        "#,
        KEYS_PER_ACCOUNT
    )
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    let (flagged, keys): (Vec<KeyLine>, Vec<KeyLine>) =
        lines.into_iter().partition(|line| line.waiting_list);
    let jobs = sqlx::query!(
        r#"
        SELECT id, kind, dedupe_key, attempts, last_error, dead_at IS NOT NULL AS "dead!",
               to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS "run_at!"
          FROM jobs WHERE done_at IS NULL ORDER BY id DESC LIMIT 50
        "#
    )
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    let deliveries = sqlx::query!(
        r#"
        SELECT a.endpoint_id, w.account_id, w.url, a.event_id, a.attempt, a.status_code, a.error,
               a.outcome, a.duration_ms,
               to_char(a.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS "at!"
          FROM webhook_attempts a JOIN webhook_endpoints w ON w.id = a.endpoint_id
         ORDER BY a.seq DESC LIMIT 30
        "#
    )
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    let receipts = sqlx::query!(
        r#"
        SELECT payment_id, account_id, email,
               to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS "created!",
               to_char(sent_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS sent
          FROM receipts ORDER BY created_at DESC LIMIT 20
        "#
    )
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;

    let in_flight = keys.iter().any(KeyLine::in_flight);
    let mut out = page_start("Inspector", in_flight);
    out.push_str("<h1>Idempotency keys</h1>");
    if in_flight {
        out.push_str("<p class=\"note\">A key is in flight: this page refreshes itself.</p>");
    }
    out.push_str("<h2>Waiting for a person</h2>");
    if flagged.is_empty() {
        out.push_str("<p>None.</p>");
    } else {
        key_table(&mut out, &flagged, true);
    }
    let mut accounts: Vec<(&str, &str)> =
        keys.iter().map(|k| (k.account_id.as_str(), k.account_name.as_str())).collect();
    accounts.dedup();
    out.push_str("<h2>Recent keys by account</h2>");
    if accounts.is_empty() {
        out.push_str("<p>No keys yet.</p>");
    }
    for (id, name) in accounts {
        let _ = write!(out, "<h3>{} <code>{}</code></h3>", esc(name), esc(id));
        key_table(&mut out, keys.iter().filter(|k| k.account_id == id), false);
    }
    out.push_str("<h2>Jobs staged or dead</h2>");
    if jobs.is_empty() {
        out.push_str("<p>None: every staged job has run.</p>");
    } else {
        out.push_str(
            "<table><tr><th>job</th><th>kind</th><th>for</th><th>state</th><th>attempts</th>\
             <th>next run (UTC)</th><th>last error</th></tr>",
        );
        for job in &jobs {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                job.id,
                esc(&job.kind),
                esc(&job.dedupe_key),
                if job.dead { "<span class=\"bad\">dead</span>" } else { "staged" },
                job.attempts,
                esc(&job.run_at),
                esc(job.last_error.as_deref().unwrap_or("")),
            );
        }
        out.push_str("</table>");
    }
    out.push_str("<h2>Webhook deliveries</h2>");
    if deliveries.is_empty() {
        out.push_str("<p>None yet.</p>");
    } else {
        out.push_str(
            "<table><tr><th>at (UTC)</th><th>account</th><th>endpoint</th><th>event</th>\
             <th>attempt</th><th>answer</th><th>outcome</th><th>ms</th><th>error</th></tr>",
        );
        for d in &deliveries {
            let outcome = match d.outcome.as_str() {
                "dead" => "<span class=\"bad\">dead</span>".to_owned(),
                other => esc(other),
            };
            let _ = write!(
                out,
                "<tr><td>{}</td><td><code>{}</code></td><td><code>{}</code> {}</td>\
                 <td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&d.at),
                esc(&d.account_id),
                esc(&d.endpoint_id),
                esc(&d.url),
                esc(&d.event_id),
                d.attempt,
                d.status_code.map_or_else(|| "none".to_owned(), |c| c.to_string()),
                outcome,
                d.duration_ms,
                esc(d.error.as_deref().unwrap_or("")),
            );
        }
        out.push_str("</table>");
    }
    out.push_str("<h2>Receipts</h2>");
    if receipts.is_empty() {
        out.push_str("<p>None yet.</p>");
    } else {
        out.push_str(
            "<table><tr><th>payment</th><th>account</th><th>to</th><th>recorded (UTC)</th>\
             <th>sent (UTC)</th></tr>",
        );
        for receipt in &receipts {
            let _ = write!(
                out,
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                esc(&receipt.payment_id),
                esc(&receipt.account_id),
                esc(&receipt.email),
                esc(&receipt.created),
                esc(receipt.sent.as_deref().unwrap_or("not sent (no SMTP server)")),
            );
        }
        out.push_str("</table>");
    }
    Ok(html(StatusCode::OK, out))
}

/// One key as the overview lists it.
#[derive(Debug, Clone)]
struct KeyLine {
    /// Listed among the keys waiting for a person, rather than among an account's recent keys.
    waiting_list: bool,
    account_name: String,
    account_id: String,
    id: i64,
    key: String,
    operation: String,
    method: String,
    path: String,
    recovery_point: String,
    owner_token: Option<Uuid>,
    attempts: i32,
    lease_until: Option<String>,
    lease_active: bool,
    response_status: Option<i16>,
    finished: bool,
    flagged: bool,
    last_error: Option<String>,
    age_s: f64,
}

impl KeyLine {
    fn in_flight(&self) -> bool {
        !self.finished && !self.flagged
    }

    fn lease(&self) -> String {
        match (&self.owner_token, self.lease_active) {
            (Some(token), true) => format!(
                "held by <code>{}</code> until {}",
                short(token),
                esc(self.lease_until.as_deref().unwrap_or(""))
            ),
            (Some(token), false) => format!(
                "<span class=\"bad\">expired</span> (<code>{}</code>, {})",
                short(token),
                esc(self.lease_until.as_deref().unwrap_or(""))
            ),
            (None, _) => "free".to_owned(),
        }
    }

    fn state(&self) -> String {
        if self.flagged {
            "<span class=\"bad\">needs a person</span>".to_owned()
        } else if let Some(status) = self.response_status {
            format!("answered {status}")
        } else {
            "<span class=\"live\">in flight</span>".to_owned()
        }
    }
}

fn key_table<'a>(out: &mut String, keys: impl IntoIterator<Item = &'a KeyLine>, with_error: bool) {
    out.push_str(
        "<table class=\"keys\"><tr><th>key</th><th>request</th><th>recovery point</th><th>lease</th>\
         <th>attempts</th><th>state</th><th>age</th>",
    );
    out.push_str(if with_error { "<th>why</th></tr>" } else { "</tr>" });
    for key in keys {
        let _ = write!(
            out,
            "<tr><td><a href=\"/inspector/keys/{}\"><code>{}</code></a></td>\
             <td>{} <code>{}</code><br><small>{}</small></td><td><code>{}</code></td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td>",
            key.id,
            esc(&key.key),
            esc(&key.method),
            esc(&key.path),
            esc(&key.operation),
            esc(&key.recovery_point),
            key.lease(),
            key.attempts,
            key.state(),
            age(key.age_s),
        );
        if with_error {
            let _ = write!(out, "<td>{}</td>", esc(key.last_error.as_deref().unwrap_or("")));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
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
    let key = sqlx::query!(
        r#"
        SELECT k.id, k.account_id, a.name AS account_name, k.idempotency_key, k.operation,
               k.request_method, k.request_path, k.request_id, k.recovery_point, k.owner_token,
               coalesce(k.locked_until > now(), false) AS "lease_active!",
               to_char(k.locked_until AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') AS lease_until,
               k.attempts, k.response_status, k.response_body, k.last_error,
               k.completed_at IS NOT NULL AS "finished!", k.needs_human_at IS NOT NULL AS "flagged!",
               to_char(k.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS "created!",
               to_char(k.completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS completed,
               to_char(k.needs_human_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS flagged_at,
               to_char(k.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS next_attempt
          FROM idempotency_keys k JOIN accounts a ON a.id = k.account_id
         WHERE k.id = $1
        "#,
        id
    )
    .fetch_optional(pool)
    .await
    .map_err(unavailable)?
    .ok_or_else(not_found)?;
    let attempts = sqlx::query!(
        r#"
        SELECT attempt, request_id, took_over, recovery_point,
               to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS "at!"
          FROM idempotency_attempts WHERE key_id = $1 ORDER BY attempt
        "#,
        id
    )
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    let events = sqlx::query!(
        r#"
        SELECT action, object_id, detail,
               to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') AS "at!"
          FROM audit_events WHERE idempotency_key_id = $1 ORDER BY id
        "#,
        id
    )
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;

    // The timeline: (when, order among equals, what, detail).
    let mut timeline: Vec<(String, u8, String, String)> = vec![(
        key.created.clone(),
        0,
        "claimed (attempt 1)".to_owned(),
        format!(
            "by request <code>{}</code>; recovery point <code>started</code>",
            esc(&key.request_id)
        ),
    )];
    for attempt in &attempts {
        let who = attempt.request_id.as_deref().map_or_else(
            || "the completer (payments-worker)".to_owned(),
            |r| format!("request <code>{}</code>", esc(r)),
        );
        let how = if attempt.took_over {
            "took over from a holder whose lease had expired"
        } else {
            "resumed a key released after a transient failure"
        };
        timeline.push((
            attempt.at.clone(),
            1,
            format!("attempt {}", attempt.attempt),
            format!("{who} {how}, from <code>{}</code>", esc(&attempt.recovery_point)),
        ));
    }
    for event in &events {
        timeline.push((
            event.at.clone(),
            2,
            esc(&event.action),
            format!("<code>{}</code> {}", esc(&event.object_id), describe(&event.detail)),
        ));
    }
    if let (Some(at), Some(status)) = (&key.completed, key.response_status) {
        timeline.push((
            at.clone(),
            3,
            format!("answer stored: {status}"),
            "replayed to every retry".into(),
        ));
    }
    if let Some(at) = &key.flagged_at {
        timeline.push((
            at.clone(),
            3,
            "<span class=\"bad\">flagged for a person</span>".to_owned(),
            esc(key.last_error.as_deref().unwrap_or("")),
        ));
    }
    timeline.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));

    let in_flight = !key.finished && !key.flagged;
    let mut out = page_start(&format!("Key {}", key.idempotency_key), in_flight);
    let _ = write!(
        out,
        "<p><a href=\"/inspector\">← all keys</a></p><h1>Key <code>{}</code></h1>",
        esc(&key.idempotency_key)
    );
    if in_flight {
        out.push_str("<p class=\"note\">In flight: this page refreshes itself.</p>");
    }
    let lease = match (key.owner_token, key.lease_active) {
        (Some(token), true) => {
            format!(
                "held by <code>{}</code> until {}",
                short(&token),
                esc(key.lease_until.as_deref().unwrap_or(""))
            )
        }
        (Some(token), false) => format!("expired (was <code>{}</code>)", short(&token)),
        (None, _) => "free".to_owned(),
    };
    let facts = [
        ("account", format!("{} <code>{}</code>", esc(&key.account_name), esc(&key.account_id))),
        (
            "request",
            format!(
                "{} <code>{}</code> ({})",
                esc(&key.request_method),
                esc(&key.request_path),
                esc(&key.operation)
            ),
        ),
        (
            "recovery point",
            format!("<code id=\"recovery-point\">{}</code>", esc(&key.recovery_point)),
        ),
        ("lease", lease),
        ("attempts", key.attempts.to_string()),
        ("created (UTC)", esc(&key.created)),
        (
            "next completer attempt (UTC)",
            if in_flight {
                esc(key.next_attempt.as_deref().unwrap_or("—"))
            } else {
                "—".into()
            },
        ),
        ("last error", esc(key.last_error.as_deref().unwrap_or("—"))),
    ];
    out.push_str("<table class=\"facts\">");
    for (name, value) in facts {
        let _ = write!(out, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    out.push_str("</table><h2>Timeline</h2><ol class=\"timeline\">");
    for (at, _, what, detail) in &timeline {
        let _ = write!(
            out,
            "<li><time>{}</time> <strong>{what}</strong> <span>{detail}</span></li>",
            esc(at)
        );
    }
    out.push_str("</ol>");
    if let (Some(status), Some(body)) = (key.response_status, &key.response_body) {
        let _ =
            write!(out, "<h2>Stored answer: {status}</h2><pre>{}</pre>", esc(&masked_body(body)));
    }
    Ok(html(StatusCode::OK, out))
}

/// An audit record's detail as `name: value` pairs.
fn describe(detail: &Value) -> String {
    let Some(members) = detail.as_object() else {
        return String::new();
    };
    members
        .iter()
        .map(|(name, value)| {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let label = if name == "downstream_key" { "processor key" } else { name.as_str() };
            format!("{}: <code>{}</code>", esc(label), esc(&value))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The stored body, pretty-printed, with payment methods masked and a webhook endpoint's signing
/// secret (stored with a keyed creation's answer) hidden.
fn masked_body(body: &[u8]) -> String {
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
        return String::from_utf8_lossy(body).into_owned();
    };
    if let Some(method) = value.get_mut("payment_method")
        && let Some(token) = method.as_str()
    {
        *method = Value::String(mask(token));
    }
    if let Some(secret) = value.get_mut("secret")
        && secret.is_string()
    {
        *secret = Value::String("whsec_… (hidden)".to_owned());
    }
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

/// The first 8 characters of a token, then `…`.
fn mask(token: &str) -> String {
    let shown: String = token.chars().take(8).collect();
    if shown.len() < token.len() { format!("{shown}…") } else { shown }
}

fn short(token: &Uuid) -> String {
    token.to_string().chars().take(8).collect()
}

fn age(seconds: f64) -> String {
    match seconds {
        s if s < 60.0 => format!("{s:.1} s"),
        s if s < 3600.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.0} d", s / 86_400.0),
    }
}

/// HTML-escapes text.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:72em;\
padding:0 1em;color:#1d232b}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}\
table{border-collapse:collapse;width:100%;margin:.5em 0}th,td{text-align:left;padding:.3em .5em;\
border-bottom:1px solid #e3e6ea;vertical-align:top}th{background:#f5f7f9;font-weight:600}\
code{font:12px ui-monospace,monospace;background:#f1f3f5;padding:0 .2em;border-radius:3px}\
.bad{color:#b3261e;font-weight:600}.live{color:#0b6bcb;font-weight:600}.note{color:#0b6bcb}\
ol.timeline{list-style:none;padding:0}ol.timeline li{padding:.35em 0;border-bottom:1px solid #eef0f2}\
time{font:12px ui-monospace,monospace;color:#5b6570;margin-right:.6em}\
pre{background:#f5f7f9;padding:.8em;overflow:auto}table.facts th{width:14em}";

fn page_start(title: &str, refresh: bool) -> String {
    let refresh = if refresh { "<meta http-equiv=\"refresh\" content=\"2\">" } else { "" };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">{refresh}\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>",
        esc(title)
    )
}

fn html(status: StatusCode, mut body: String) -> Response {
    body.push_str("</body></html>");
    let mut response = (status, body).into_response();
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
    let mut body = page_start("Inspector: no such key", false);
    body.push_str("<p><a href=\"/inspector\">← all keys</a></p><h1>No such key</h1>");
    html(StatusCode::NOT_FOUND, body)
}

fn unavailable(err: sqlx::Error) -> Response {
    tracing::warn!(error = %err, "the inspector could not read the database");
    let mut body = page_start("Inspector: database unavailable", false);
    body.push_str("<h1>The database did not answer</h1><p>Reload in a moment.</p>");
    html(StatusCode::SERVICE_UNAVAILABLE, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_tokens_masked() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(mask("pm_card_chargeDeclined"), "pm_card_…");
        assert_eq!(mask("short"), "short");
        let body = masked_body(br#"{"id":"pay_1","payment_method":"pm_card_visa"}"#);
        assert!(body.contains("pm_card_…") && !body.contains("visa"), "{body}");
        let body = masked_body(br#"{"id":"we_1","secret":"whsec_abcdef123456"}"#);
        assert!(body.contains("we_1") && !body.contains("abcdef123456"), "{body}");
    }

    #[test]
    fn audit_details_read_as_pairs() {
        let detail = serde_json::json!({"charge": "ch_1", "downstream_key": "pay_1/charge"});
        assert_eq!(
            describe(&detail),
            "charge: <code>ch_1</code>, processor key: <code>pay_1/charge</code>"
        );
    }
}
