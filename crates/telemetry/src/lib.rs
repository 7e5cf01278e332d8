//! Telemetry of both binaries: logs (pretty text for people, JSON lines for machines, always to
//! standard error, since standard output belongs to commands such as `accounts create`), the
//! Prometheus recorder behind `/metrics`, and the shutdown signal. Kept out of
//! `payments-settings`, which only reads and checks configuration.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use payments_settings::{LogFormat, LogSettings};

/// Installs the global subscriber. `RUST_LOG`, when set, replaces the configured filter. Calling
/// it twice is harmless (the first subscriber stays), which keeps tests simple.
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _already_installed = match settings.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Pretty => builder.try_init(),
    };
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// The process's Prometheus recorder, installed on first use; `render()` is the `/metrics` body.
/// One per process, so tests that start several servers in one process share it.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let seconds =
            [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let handle = match builder.install_recorder() {
            Ok(handle) => handle,
            // Another recorder is installed already: keep a private one, so rendering still works.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        };
        keep_up(handle.clone());
        handle
    })
}

/// How often the recorder's histograms are drained into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The name of the thread that drains them.
pub const UPKEEP_THREAD: &str = "metrics-upkeep";

/// Drains the recorder's histograms every few seconds for the life of the process. The recorder
/// keeps every sample of a histogram until something drains it, and only a scrape of `/metrics`
/// does otherwise: a server nobody scrapes (a laptop, a benchmark) would grow by eight bytes a
/// request for ever (`make bench` saw 20 MiB more after a million requests).
fn keep_up(handle: PrometheusHandle) {
    let started = std::thread::Builder::new().name(UPKEEP_THREAD.into()).spawn(move || {
        loop {
            std::thread::sleep(UPKEEP_EVERY);
            handle.run_upkeep();
        }
    });
    if let Err(err) = started {
        tracing::warn!(error = %err, "cannot start the metrics upkeep thread; histograms grow until scraped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")] // reads /proc
    fn the_recorder_is_kept_up_by_a_thread_of_its_own() {
        metrics();
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_owned())
                .collect()
        };
        // The thread names itself once it runs.
        for _ in 0..100 {
            if names().iter().any(|name| name == UPKEEP_THREAD) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no {UPKEEP_THREAD} thread among {:?}", names());
    }
}
