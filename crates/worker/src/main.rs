//! `payments-worker`: the completer, the reaper, the receipts and the webhook deliveries. See
//! `payments_worker`.

use std::process::ExitCode;

use clap::Parser;
use tokio::sync::watch;

/// Drives unfinished idempotency keys to their end, deletes old ones, and runs staged jobs.
#[derive(Debug, Parser)]
#[command(name = "payments-worker", version)]
struct Args {
    /// Run one pass of each loop and exit (for tests and cron-style use).
    #[arg(long)]
    once: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("payments-worker: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let settings = payments_settings::Settings::load()?;
    payments_telemetry::init(&settings.log);
    let _ = payments_telemetry::metrics();
    let worker = payments_worker::build(&settings)?;
    if settings.worker.metrics_port > 0 && !args.once {
        serve_metrics(settings.worker.metrics_port).await;
    }
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        payments_telemetry::shutdown_signal().await;
        tracing::info!("stopping after the item in hand");
        let _ = stop_tx.send(true);
    });
    if args.once {
        let report = worker.run_once(&stop).await?;
        eprintln!("{report:?}");
    } else {
        tracing::info!("payments-worker running");
        worker.run_until(stop).await;
    }
    Ok(())
}

/// Serves `GET /metrics` on 127.0.0.1; a taken port is reported, not fatal.
async fn serve_metrics(port: u16) {
    let router = axum::Router::new()
        .route("/metrics", axum::routing::get(|| async { payments_telemetry::metrics().render() }));
    match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(listener) => {
            tracing::info!(port, "worker metrics at /metrics");
            tokio::spawn(async move { axum::serve(listener, router).await });
        }
        Err(err) => tracing::warn!(port, error = %err, "worker metrics are off: the port is taken"),
    }
}
