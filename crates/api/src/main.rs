//! `payments-api`: see `payments_api::cli` for the commands.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = payments_api::cli::Cli::parse();
    match payments_api::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("payments-api: {err:#}");
            ExitCode::FAILURE
        }
    }
}
