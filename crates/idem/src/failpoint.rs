//! Failpoints: named places where a test can stop or slow the process, to prove what a crash or a
//! stall there leaves behind.
//!
//! They exist only when the crate is built with the `failpoints` feature (the end-to-end tests
//! turn it on; release builds of the binaries never have it). At run time, the environment
//! variable `PAYMENTS_FAILPOINTS` switches them on: `name=pause` or `name=sleep(ms)`, several
//! separated by `;`. A failpoint that fires writes `FAILPOINT <name>` to standard error first, so
//! a harness can kill the process (SIGKILL) right there, or act while it sleeps.

/// Passes the failpoint whose name `name` builds. Without the `failpoints` feature the name is
/// never built, so a failpoint on a hot path costs nothing.
#[cfg(feature = "failpoints")]
pub async fn failpoint(name: impl FnOnce() -> String) {
    use std::io::Write;
    let name = name();
    let name = name.as_str();
    let Some(action) = configured().iter().find(|(n, _)| n == name).map(|(_, a)| *a) else {
        return;
    };
    {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "FAILPOINT {name}");
        let _ = stderr.flush();
    }
    match action {
        Action::Pause => std::future::pending::<()>().await,
        Action::Sleep(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
    }
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
