//! `payments-worker`: the completer, the reaper and the job runner. See `payments_worker`.

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
    payments_settings::telemetry::init(&settings.log);
    let worker = payments_worker::build(&settings)?;
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        payments_settings::telemetry::shutdown_signal().await;
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
