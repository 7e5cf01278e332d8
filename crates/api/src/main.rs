//! `payments-api`: see `payments_api::cli` for the commands.

use std::process::ExitCode;

use clap::Parser;

// glibc's allocator spent about a tenth of the server's CPU under load (`make bench`, perf).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
