//! What every test binary of the workspace shares, and nothing else: a wait for a condition
//! with a deadline. A test that waits for something to happen elsewhere (a server reaching a
//! recovery point, a worker inside its processor call) waits through [`eventually`], never in
//! a loop of its own: a wait that can never end hangs the whole run instead of failing one test.
//!
//! A dev-dependency only, depending on tokio alone.

use std::future::Future;
use std::time::Duration;

/// The deadline of a wait in a test: long enough that no healthy run on a loaded machine meets it,
/// short enough that a broken one fails in a test's time rather than CI's.
pub const WAIT: Duration = Duration::from_secs(10);

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(15);

/// Checks `check` every 15 ms until it holds, and fails the test (a panic naming `what` and the
/// deadline) if it still does not after `timeout`. `what` says what is awaited, as the end of
/// "still waiting for …".
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let calls = AtomicUsize::new(0);
/// payments_testkit::eventually("the third call", payments_testkit::WAIT, || async {
///     calls.fetch_add(1, Ordering::SeqCst) == 2
/// })
/// .await;
/// # }
/// ```
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still waiting for {what} after {timeout:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_condition_is_checked_until_it_holds_and_no_more() {
        let mut checks = 0;
        eventually("the third check", WAIT, || {
            checks += 1;
            let holds = checks == 3;
            async move { holds }
        })
        .await;
        assert_eq!(checks, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "still waiting for the impossible after 50ms")]
    async fn a_condition_that_never_holds_fails_naming_it_after_the_timeout() {
        eventually("the impossible", Duration::from_millis(50), || async { false }).await;
    }
}
