//! The one table `make bench` prints, in Markdown.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use sqlx::PgPool;

use crate::Scenario;
use crate::floor::FloorRun;
use crate::load::Outcome;
use crate::server::Cpu;
use crate::stats::RoleCalls;

/// One scenario at one concurrency: the API's run and pgbench's beside it.
#[derive(Debug)]
pub struct Row {
    pub scenario: Scenario,
    pub connections: usize,
    pub api: Outcome,
    /// The design's floor (`floor::design`).
    pub design: FloorRun,
    /// The project's floor: the API's own SQL.
    pub floor: FloorRun,
    /// CPU spent during the API's run.
    pub api_cpu: Cpu,
    /// CPU spent during pgbench's run.
    pub floor_cpu: Cpu,
}

/// The counting pass of one scenario.
#[derive(Debug)]
pub struct Counted {
    pub scenario: Scenario,
    pub requests: u64,
    pub api: RoleCalls,
    pub api_transactions: i64,
    pub floor_transactions: u64,
    pub floor: RoleCalls,
    pub floor_server_transactions: i64,
}

/// Peak resident memory of the processes, in KiB.
#[derive(Debug, Default)]
pub struct Memory {
    pub api_peak_kib: Option<u64>,
    pub worker_peak_kib: Option<u64>,
    pub sim_peak_kib: Option<u64>,
    /// Growth of processor-sim's resident memory per 100,000 charges added.
    pub sim_kib_per_100k: Option<u64>,
    /// Charges processor-sim held at the end.
    pub sim_charges: u64,
}

/// Everything measured, and the machine it was measured on.
#[derive(Debug)]
pub struct Report {
    machine: Vec<(String, String)>,
    seconds: u64,
    fanout: u64,
    pub rows: Vec<Row>,
    pub counts: Vec<Counted>,
    pub memory: Memory,
}

impl Report {
    pub async fn new(pool: &PgPool, seconds: u64, fanout: u64) -> sqlx::Result<Self> {
        let postgres: String = sqlx::query_scalar("SELECT version()").fetch_one(pool).await?;
        let settings: Vec<(String, String)> = sqlx::query_as(
            "SELECT name, setting FROM pg_settings
              WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync', 'max_connections')
              ORDER BY name",
        )
        .fetch_all(pool)
        .await?;
        let settings =
            settings.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ");
        let cpu = read("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into());
        let memory = read("/proc/meminfo", "MemTotal").unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
        Ok(Self {
            machine: vec![
                ("CPU".into(), format!("{cores} × {cpu}")),
                ("Memory".into(), memory),
                (
                    "PostgreSQL".into(),
                    postgres.split(" on ").next().unwrap_or(&postgres).to_owned(),
                ),
                ("Server settings".into(), settings),
            ],
            seconds,
            fanout,
            rows: Vec::new(),
            counts: Vec::new(),
            memory: Memory::default(),
        })
    }

    /// The machine and server the run measured, as a Markdown section.
    pub fn render_machine(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Machine\n");
        for (name, value) in &self.machine {
            let _ = writeln!(out, "- {name}: {value}");
        }
        out
    }

    pub fn render(&self) -> String {
        let mut out = self.render_machine();
        let _ = writeln!(
            out,
            "\n## Throughput and latency ({} s per run; storm: {} requests per key)\n",
            self.seconds, self.fanout
        );
        let _ = writeln!(
            out,
            "API / design floor is the headline: the design floor is the least SQL the idempotency \
             design needs (crates/bench/pgbench/design/), and does not move with the project's \
             SQL. The same-SQL floor runs the API's own statements.\n"
        );
        let _ = writeln!(
            out,
            "| scenario | conns | API req/s | API p50 ms | API p99 ms | design tx/s | design p99 ms \
             | **API / design** | p99 API / design | same-SQL tx/s | same-SQL p99 ms \
             | API / same SQL | API answers |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for row in &self.rows {
            let api_p99 = ms(&row.api.latency, 99.0);
            let design_p99 = ms(&row.design.latency, 99.0);
            let floor_p99 = ms(&row.floor.latency, 99.0);
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | **{:.0} %** | {:.1}× | {:.0} \
                 | {:.2} | {:.0} % | {} |",
                row.scenario.name(),
                row.connections,
                row.api.per_second(),
                ms(&row.api.latency, 50.0),
                api_p99,
                row.design.per_second,
                design_p99,
                100.0 * row.api.per_second() / row.design.per_second.max(1e-9),
                api_p99 / design_p99.max(1e-9),
                row.floor.per_second,
                floor_p99,
                100.0 * row.api.per_second() / row.floor.per_second.max(1e-9),
                answers(&row.api, row.floor.failed + row.design.failed),
            );
        }
        let _ = writeln!(
            out,
            "\n## Where the CPU goes (µs of CPU per request or pgbench transaction)\n"
        );
        let _ = writeln!(
            out,
            "| scenario | conns | API: payments-api | API: load generator | API: processor-sim \
             | API: postgres | same-SQL floor: pgbench | same-SQL floor: postgres |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for row in &self.rows {
            let per = |ticks: u64, n: u64| ticks as f64 * 10_000.0 / n.max(1) as f64;
            let (a, f) = (&row.api_cpu, &row.floor_cpu);
            let (requests, transactions) = (row.api.requests, row.floor.transactions);
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                row.scenario.name(),
                row.connections,
                per(a.api, requests),
                per(a.load, requests),
                per(a.sim, requests),
                per(a.postgres, requests),
                per(f.pgbench, transactions),
                per(f.postgres, transactions),
            );
        }
        let _ =
            writeln!(out, "\n## Statements and transactions per request (counted by the server)\n");
        let _ = writeln!(
            out,
            "| scenario | requests | API statements | of them queries | of them BEGIN \
             | API transactions | floor queries | floor transactions |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for c in &self.counts {
            let per = |n: i64, d: u64| n as f64 / d.max(1) as f64;
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                c.scenario.name(),
                c.requests,
                per(c.api.statements, c.requests),
                per(c.api.queries, c.requests),
                per(c.api.begins, c.requests),
                per(c.api_transactions, c.requests),
                per(c.floor.queries, c.floor_transactions),
                per(c.floor_server_transactions, c.floor_transactions),
            );
        }
        let m = &self.memory;
        let _ = writeln!(out, "\n## Peak resident memory\n");
        let _ = writeln!(out, "- payments-api: {}", mib(m.api_peak_kib));
        let _ = writeln!(out, "- payments-worker: {}", mib(m.worker_peak_kib));
        let per_100k = m.sim_kib_per_100k;
        let _ = writeln!(
            out,
            "- processor-sim: {} peak, holding {} charges: {} per 100,000 charges",
            mib(m.sim_peak_kib),
            m.sim_charges,
            mib(per_100k)
        );
        out
    }
}

pub(crate) fn ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_percentile(quantile) as f64 / 1000.0
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "n/a".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// The API's statuses, and any request that got no answer or pgbench transaction that failed.
pub(crate) fn answers(api: &Outcome, floor_failed: u64) -> String {
    let mut parts: Vec<String> = api.statuses.iter().map(|(s, n)| format!("{s}×{n}")).collect();
    if api.errors > 0 {
        parts.push(format!("no answer×{}", api.errors));
    }
    if floor_failed > 0 {
        parts.push(format!("pgbench failed×{floor_failed}"));
    }
    parts.join(", ")
}

/// The value of the first `name: value` line of a /proc file.
fn read(path: &str, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(name))?;
    Some(line.split_once(':')?.1.trim().to_owned())
}
