//! Failpoints: named places where a test can stop or slow the process, to prove what a crash or a
//! stall there leaves behind.
//!
//! They exist only when the crate is built with the `failpoints` feature (the end-to-end tests
//! turn it on; release builds of the binaries never have it). At run time, the environment
//! variable `PAYMENTS_FAILPOINTS` switches them on: `name=pause` or `name=sleep(ms)`, several
//! separated by `;`; and, where the code asks [`answer_lost`], `name=lose`: what the database
//! did is done, and the process is told its connection failed. A failpoint that fires writes
//! `FAILPOINT <name>` to standard error first, so a harness can kill the process (SIGKILL) right
//! there, or act while it sleeps.

/// Passes the failpoint whose name `name` builds. Without the `failpoints` feature the name is
/// never built, so a failpoint on a hot path costs nothing.
#[cfg(feature = "failpoints")]
pub async fn failpoint(name: impl FnOnce() -> String) {
    match fired(&name()) {
        Some(Action::Pause) => std::future::pending::<()>().await,
        Some(Action::Sleep(ms)) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
        Some(Action::Lose) | None => {}
    }
}

/// Whether the failpoint whose name `name` builds is set to `lose`: the caller then answers as
/// if the connection had failed after the database acted (a commit whose answer was lost).
#[cfg(feature = "failpoints")]
pub fn answer_lost(name: impl FnOnce() -> String) -> bool {
    matches!(fired(&name()), Some(Action::Lose))
}

/// Without the `failpoints` feature no answer is lost.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn answer_lost(_name: impl FnOnce() -> String) -> bool {
    false
}

/// The action configured for `name`, said on standard error, if there is one.
#[cfg(feature = "failpoints")]
fn fired(name: &str) -> Option<Action> {
    use std::io::Write;
    let action = configured().iter().find(|(n, _)| n == name).map(|(_, a)| *a)?;
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "FAILPOINT {name}");
    let _ = stderr.flush();
    Some(action)
}

/// Without the `failpoints` feature a failpoint is nothing at all.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn failpoint(_name: impl FnOnce() -> String) {}

#[cfg(feature = "failpoints")]
#[derive(Debug, Clone, Copy)]
enum Action {
    Pause,
    Sleep(u64),
    Lose,
}

#[cfg(feature = "failpoints")]
fn configured() -> &'static [(String, Action)] {
    static CONFIGURED: std::sync::OnceLock<Vec<(String, Action)>> = std::sync::OnceLock::new();
    CONFIGURED.get_or_init(|| {
        let spec = std::env::var("PAYMENTS_FAILPOINTS").unwrap_or_default();
        spec.split(';')
            .filter_map(|entry| {
                let (name, action) = entry.trim().split_once('=')?;
                let action = match action.trim() {
                    "pause" => Action::Pause,
                    "lose" => Action::Lose,
                    other => {
                        let ms = other.strip_prefix("sleep(")?.strip_suffix(')')?.parse().ok()?;
                        Action::Sleep(ms)
                    }
                };
                Some((name.trim().to_owned(), action))
            })
            .collect()
    })
}
