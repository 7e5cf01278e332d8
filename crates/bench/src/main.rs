//! `payments-bench`: what idempotency costs, measured against the floor the database sets.
//!
//! It starts the real `payments-api`, `payments-worker` and `processor-sim` (no added latency)
//! against a fresh database, drives three scenarios over 1, 8 and 32 keep-alive connections, and
//! right beside each run sends through `pgbench`, at the same concurrency and for the same time,
//! the design's floor (the least SQL the idempotency design needs, on a minimal schema: the
//! headline ratio) and the project's floor (the API's own statements):
//!
//! - `new`: a fresh key per request, the whole flow (claim, two phases, a processor call);
//! - `replay`: a completed key per request, answered from the stored response;
//! - `storm`: `--fanout` requests per key at once (one creates, the rest wait or replay).
//!
//! Then it counts, with `pg_stat_statements` and the database's transaction counter, the SQL
//! statements and transactions one request costs, and reads the processes' peak memory. `make
//! bench` runs it against a private PostgreSQL server it starts with `pg_stat_statements`
//! loaded; see BENCHMARKS.md.

mod fill;
mod floor;
mod load;
mod report;
mod scale;
mod scale_report;
mod server;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use sha2::{Digest, Sha256};
use sqlx::postgres::PgPoolOptions;

use crate::floor::Floor;
use crate::load::{Budget, Keys, Target};
use crate::report::{Counted, Report, Row};
use crate::server::{API_ROLE, Database, FLOOR_ROLE, Process, WORKER_ROLE};

/// The design floor's database, beside the API's.
const DESIGN_DATABASE: &str = "payments_bench_design";

/// A benchmark scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// A fresh key per request: the whole flow.
    New,
    /// A completed key per request: the stored answer.
    Replay,
    /// Many concurrent requests per key.
    Storm,
    /// `GET /v1/payments/{id}` of one of the account's payments.
    Get,
    /// A page of 100 of the account's payments, after a cursor deep in the account.
    List,
    /// A poll of the account's events: the next 100 after a cursor.
    Events,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Replay => "replay",
            Self::Storm => "storm",
            Self::Get => "get",
            Self::List => "list",
            Self::Events => "events",
        }
    }

    /// Whether the scenario only reads (GET), with no idempotency key.
    pub fn reads(self) -> bool {
        matches!(self, Self::Get | Self::List | Self::Events)
    }
}

/// Measures the payments API against the floor pgbench sets with the same SQL. No `Debug`: the
/// database URL may hold a password.
#[derive(Parser)]
#[command(name = "payments-bench", version)]
pub(crate) struct Args {
    /// A PostgreSQL server that preloads pg_stat_statements, trust authentication, as a
    /// superuser. Its database `payments_bench` is dropped and created afresh (only that one,
    /// whatever database the URL names).
    #[arg(long, env = "BENCH_DATABASE_URL")]
    pub(crate) database_url: String,
    /// Where payments-api, payments-worker and processor-sim are (default: beside this program).
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
    /// Where logs, pgbench scripts and results go.
    #[arg(long, default_value = "target/bench")]
    pub(crate) work_dir: PathBuf,
    /// Seconds each measured run lasts (each side).
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Seconds of unmeasured load before each of the API's runs.
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup: u64,
    /// Connection counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32])]
    pub(crate) connections: Vec<usize>,
    /// Scenarios, comma-separated.
    #[arg(long, value_delimiter = ',', default_values = ["new", "replay", "storm"])]
    pub(crate) scenarios: Vec<Scenario>,
    /// Requests per scenario in the statement-counting pass (over 8 connections).
    #[arg(long, default_value_t = 2000)]
    pub(crate) count: u64,
    /// Completed keys that `replay` cycles through.
    #[arg(long, default_value_t = 2000)]
    pub(crate) replay_keys: u64,
    /// Requests per key in `storm`.
    #[arg(long, default_value_t = 8)]
    pub(crate) fanout: u64,
    /// Charges sent straight to processor-sim at the end, to measure what holding them costs.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) sim_charges: u64,
    /// Threads of the load generator and of pgbench (the same for both).
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// At scale: measure on the fresh database, fill it (and the design floor's) with this many
    /// payments as a year of use leaves them, and measure again (`scale.rs`). 0: the usual run.
    #[arg(long, default_value_t = 0)]
    pub(crate) fill: u64,
    /// Payments per statement of the fill.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) fill_chunk: u64,
    /// At scale: keys past their retention put in the reaper's way while `new` runs.
    #[arg(long, default_value_t = 200_000)]
    pub(crate) backlog: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

/// The system under test, started: its database, the three processes, and whom the load acts as.
pub(crate) struct System {
    pub db: Database,
    pub api: Process,
    pub worker: Process,
    pub sim: Process,
    pub sim_url: String,
    pub target: Target,
    /// The benchmark's account, and the SHA-256 of its API key in hex.
    pub account: String,
    pub key_hash: String,
    /// The design floor's database, as the floor's role.
    pub design_url: String,
}

/// A fresh database with the account, the processes started against it, the completed payments
/// `replay` asks for, and the design floor's database beside it.
async fn start(args: &Args) -> anyhow::Result<System> {
    let bin_dir = args.bin_dir.clone().unwrap_or_else(server::own_dir);
    let logs = args.work_dir.join("logs");
    std::fs::create_dir_all(&logs)?;

    eprintln!("bench: preparing a fresh database");
    let db = Database::fresh(&args.database_url).await?;
    let admin_env = [("DATABASE_URL", db.url()), ("PAYMENTS__LOG__FILTER", "warn".to_owned())];
    server::run_to_end(&bin_dir, "payments-api", &["migrate"], &admin_env)?;
    let secret = server::run_to_end(
        &bin_dir,
        "payments-api",
        &["accounts", "create", "--name", "bench"],
        &admin_env,
    )?;
    let key_hash = Sha256::digest(secret.as_bytes());
    let account: String = sqlx::query_scalar("SELECT account_id FROM api_keys WHERE key_hash = $1")
        .bind(&key_hash[..])
        .fetch_one(&db.pool)
        .await
        .context("the account the new key belongs to")?;

    let sim_port = server::free_port()?;
    let sim =
        Process::start(&bin_dir, &logs, "processor-sim", &["--port", &sim_port.to_string()], &[])?;
    let sim_url = format!("http://127.0.0.1:{sim_port}");
    server::wait_ready(&format!("{sim_url}/_sim/stats")).await?;

    let common = |role: &str| {
        vec![
            ("DATABASE_URL", db.url_as(role)),
            ("PAYMENTS__PROCESSOR__BASE_URL", sim_url.clone()),
            ("PAYMENTS__RATE_LIMIT__PER_SECOND", "0".to_owned()),
            ("PAYMENTS__WORKER__METRICS_PORT", "0".to_owned()),
            ("PAYMENTS__LOG__FILTER", "warn".to_owned()),
            // A database made afresh for the run: any key seals its endpoints' secrets.
            ("PAYMENTS__WEBHOOKS__SEALING_KEY", "b3".repeat(32)),
            // Nobody scrapes during a run (the report reads pg_stat_statements).
            ("PAYMENTS__HTTP__ADMIN_PORT", "0".to_owned()),
        ]
    };
    let api_port = server::free_port()?;
    let mut api_env = common(API_ROLE);
    api_env.push(("PAYMENTS__HTTP__PORT", api_port.to_string()));
    let api = Process::start(&bin_dir, &logs, "payments-api", &["serve"], &api_env)?;
    let base = format!("http://127.0.0.1:{api_port}");
    server::wait_ready(&format!("{base}/readyz")).await?;
    let worker = Process::start(&bin_dir, &logs, "payments-worker", &[], &common(WORKER_ROLE))?;

    let target = Target { url: format!("{base}/v1/payments"), secret };
    eprintln!("bench: creating {} completed payments for `replay`", args.replay_keys);
    load::preload(&target, args.replay_keys).await?;

    eprintln!("bench: preparing the design floor's database");
    let design_url = design_database(&db, args.replay_keys).await?;
    Ok(System {
        db,
        api,
        worker,
        sim,
        sim_url,
        target,
        account,
        key_hash: hex(&key_hash),
        design_url,
    })
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let system = start(&args).await?;
    if args.fill > 0 {
        return scale::measure(&args, system).await;
    }
    let System { db, mut api, mut worker, sim, sim_url, target, account, key_hash, design_url } =
        system;
    let (design, floor) = floors(&args, &db, &account, &key_hash, &design_url)?;
    let keys = |scenario: Scenario, run: String| Keys {
        scenario,
        run,
        replay_keys: args.replay_keys,
        fanout: args.fanout,
        paths: std::sync::Arc::from([]),
    };

    let mut report = Report::new(&db.pool, args.seconds, args.fanout).await?;
    for &scenario in &args.scenarios {
        for &connections in &args.connections {
            eprintln!("bench: {} at {connections} connection(s)", scenario.name());
            let cpu = || server::Cpu::now(api.pid(), sim.pid());
            let design_run =
                design.run(scenario, connections, Budget::Time(secs(args.seconds))).await?;
            let before = cpu();
            let floor_run =
                floor.run(scenario, connections, Budget::Time(secs(args.seconds))).await?;
            let floor_cpu = before.until(cpu());
            let run = format!("{}-{connections}", scenario.name());
            load::run(
                &target,
                &keys(scenario, format!("{run}-warmup")),
                connections,
                Budget::Time(secs(args.warmup)),
            )
            .await?;
            let before = cpu();
            let api_run = load::run(
                &target,
                &keys(scenario, run),
                connections,
                Budget::Time(secs(args.seconds)),
            )
            .await?;
            let api_cpu = before.until(cpu());
            api.check_alive()?;
            worker.check_alive()?;
            report.rows.push(Row {
                scenario,
                connections,
                api: api_run,
                design: design_run,
                floor: floor_run,
                api_cpu,
                floor_cpu,
            });
        }
    }

    // The counting pass: the worker is stopped so that the database's transaction counter holds
    // only the API's (or pgbench's) transactions.
    for &scenario in &args.scenarios {
        eprintln!("bench: counting the statements of {}", scenario.name());
        worker.signal("STOP")?;
        // Whatever ran before has reported its transactions once every backend has been idle.
        stats::settle().await;
        stats::reset(&db.pool).await?;
        let before = stats::transactions(&db.pool).await?;
        let counted = load::run(
            &target,
            &keys(scenario, format!("{}-count", scenario.name())),
            8,
            Budget::Requests(args.count),
        )
        .await?;
        stats::settle().await;
        let after_api = stats::transactions(&db.pool).await?;
        let floor_count = floor.run(scenario, 8, Budget::Requests(args.count)).await?;
        stats::settle().await;
        let after_floor = stats::transactions(&db.pool).await?;
        worker.signal("CONT")?;
        report.counts.push(Counted {
            scenario,
            requests: counted.requests,
            api: stats::calls(&db.pool, API_ROLE).await?,
            api_transactions: after_api - before,
            floor_transactions: floor_count.transactions,
            floor: stats::calls(&db.pool, FLOOR_ROLE).await?,
            floor_server_transactions: after_floor - after_api,
        });
    }

    report.memory.api_peak_kib = api.peak_rss_kib();
    report.memory.worker_peak_kib = worker.peak_rss_kib();
    drop((api, worker));
    eprintln!("bench: {} more charges straight to processor-sim, for its memory", args.sim_charges);
    let (held_before, rss_before) = (sim_charges(&sim_url).await?, sim.rss_kib());
    load::charges(&sim_url, args.sim_charges).await?;
    let (held_after, rss_after) = (sim_charges(&sim_url).await?, sim.rss_kib());
    report.memory.sim_peak_kib = sim.peak_rss_kib();
    report.memory.sim_charges = held_after;
    report.memory.sim_kib_per_100k = rss_before.zip(rss_after).map(|(before, after)| {
        after.saturating_sub(before) * 100_000 / held_after.saturating_sub(held_before).max(1)
    });
    drop(sim);

    let text = report.render();
    println!("{text}");
    let out = args.work_dir.join("results.md");
    std::fs::write(&out, &text)?;
    eprintln!("bench: wrote {}", out.display());
    Ok(())
}

/// The design's floor and the project's, over the same pgbench threads as the load generator's.
pub(crate) fn floors(
    args: &Args,
    db: &Database,
    account: &str,
    key_hash: &str,
    design_url: &str,
) -> anyhow::Result<(Floor, Floor)> {
    let (work_dir, keys, fanout, threads) =
        (&args.work_dir, args.replay_keys, args.fanout, args.threads);
    let design = Floor::design(work_dir, design_url.to_owned(), keys, fanout, threads)?;
    let url = db.url_as(FLOOR_ROLE);
    let project = Floor::project(work_dir, url, account, key_hash, keys, fanout, threads)?;
    Ok((design, project))
}

/// A database of its own for the design floor, beside the API's on the same server: the design's
/// minimal schema and `replay_keys` completed keys (`pgbench/design/`). Its URL, as the floor's
/// role.
async fn design_database(db: &Database, replay_keys: u64) -> anyhow::Result<String> {
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{DESIGN_DATABASE}\" WITH (FORCE)"))
        .execute(&db.pool)
        .await?;
    sqlx::query(&format!("CREATE DATABASE \"{DESIGN_DATABASE}\"")).execute(&db.pool).await?;
    let options = db.options.clone().database(DESIGN_DATABASE);
    let pool = PgPoolOptions::new().max_connections(1).connect_with(options).await?;
    sqlx::raw_sql(floor::design::SCHEMA).execute(&pool).await.context("the design's schema")?;
    // One statement at a time: the seed ends with a VACUUM, which no transaction may hold.
    let seed = floor::design::SEED.replace(":nkeys", &replay_keys.to_string());
    for statement in seed.split(";\n") {
        let sql =
            statement.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with("--"));
        if sql {
            sqlx::raw_sql(statement).execute(&pool).await.context("the design's replay keys")?;
        }
    }
    pool.close().await;
    Ok(format!(
        "postgres://{FLOOR_ROLE}@{}:{}/{DESIGN_DATABASE}",
        db.options.get_host(),
        db.options.get_port()
    ))
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How many charges the stand-in holds.
async fn sim_charges(sim_url: &str) -> anyhow::Result<u64> {
    let stats: serde_json::Value =
        reqwest::get(format!("{sim_url}/_sim/stats")).await?.error_for_status()?.json().await?;
    stats["charges_created"].as_u64().context("charges_created in /_sim/stats")
}
