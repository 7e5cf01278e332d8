//! The inspector's pages as `maud` templates: every value is escaped by construction, and the
//! only markup that is not is the style sheet below.
//!
//! Here: the page around every body, the small pages (login, 404, 503) and the helpers the pages
//! share. The overview is in `overview`, one key's page in `key_page`.

mod key_page;
mod overview;

pub use key_page::{KeyPage, key_page};
pub use overview::{Overview, overview};

use maud::{DOCTYPE, Markup, PreEscaped, html};
use uuid::Uuid;

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:72em;\
padding:0 1em;color:#1d232b}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}\
table{border-collapse:collapse;width:100%;margin:.5em 0}th,td{text-align:left;padding:.3em .5em;\
border-bottom:1px solid #e3e6ea;vertical-align:top}th{background:#f5f7f9;font-weight:600}\
code{font:12px ui-monospace,monospace;background:#f1f3f5;padding:0 .2em;border-radius:3px}\
.bad{color:#b3261e;font-weight:600}.live{color:#0b6bcb;font-weight:600}.note{color:#0b6bcb}\
ol.timeline{list-style:none;padding:0}ol.timeline li{padding:.35em 0;border-bottom:1px solid #eef0f2}\
time{font:12px ui-monospace,monospace;color:#5b6570;margin-right:.6em}\
pre{background:#f5f7f9;padding:.8em;overflow:auto;white-space:pre-wrap;word-break:break-all}\
table.facts th{width:14em}.beside{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}\
.beside>div{flex:1 1 30em;min-width:0}svg{max-width:100%;height:auto}#legend ul{padding-left:1.2em}";

/// A whole page; `refresh` reloads it every two seconds (while a key is in flight).
fn page(title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if refresh { meta http-equiv="refresh" content="2"; }
                meta name="viewport" content="width=device-width,initial-scale=1";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body { (body) }
        }
    }
}

/// The 401 page: a form that asks for the token.
pub fn login(wrong: bool, next: &str) -> Markup {
    page(
        "Inspector: operator token required",
        false,
        html! {
            h1 { "Operator token required" }
            @if wrong { p.bad { "That token is not the operator token." } }
            p {
                "This page shows the server's idempotency keys. Enter the operator token ("
                code { "inspector.token" } "; " code { "make run" } " prints it)."
            }
            form method="post" action="/inspector/login" {
                input type="hidden" name="next" value=(next);
                input type="password" name="token" autocomplete="off" aria-label="operator token";
                " " button type="submit" { "Open" }
            }
        },
    )
}

/// The `429` page: too many wrong tokens; the next try in `seconds`.
pub fn too_many_guesses(seconds: u64) -> Markup {
    page(
        "Inspector: too many wrong tokens",
        false,
        html! {
            h1 { "Too many wrong tokens" }
            p { "Try again in " (seconds) " s." }
        },
    )
}

/// The 404 page.
pub fn not_found() -> Markup {
    page(
        "Inspector: no such key",
        false,
        html! { p { a href="/inspector" { "← all keys" } } h1 { "No such key" } },
    )
}

/// The 503 page.
pub fn unavailable() -> Markup {
    page(
        "Inspector: database unavailable",
        false,
        html! { h1 { "The database did not answer" } p { "Reload in a moment." } },
    )
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

#[cfg(test)]
mod tests;
