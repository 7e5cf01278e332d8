//! The floors: each scenario's SQL alone, sent by `pgbench` at the same concurrency as the API's
//! run. Two of them:
//!
//! - the design's floor (`pgbench/design/`, copied from the steering repository's
//!   `shared/bench-floor/`): the least SQL any implementation of the idempotency design must send,
//!   on a minimal schema of its own. It does not move when the project's SQL changes, so API /
//!   design floor is the headline ratio;
//! - the project's floor (`pgbench/new.sql`, `replay.sql`): the API's own statements, as the
//!   account the API's requests act for: what the API costs beyond the SQL it sends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;

use crate::Scenario;
use crate::load::{Budget, histogram};

/// A new payment's statements (`crates/bench/pgbench/new.sql`).
const NEW_SQL: &str = include_str!("../pgbench/new.sql");
/// A replay's statements (`crates/bench/pgbench/replay.sql`).
const REPLAY_SQL: &str = include_str!("../pgbench/replay.sql");
/// The reading scenarios' floors (`crates/bench/pgbench/reads/`): the least SQL each read needs,
/// on the project's tables.
const READS: [(Scenario, &str); 3] = [
    (Scenario::Get, include_str!("../pgbench/reads/get.sql")),
    (Scenario::List, include_str!("../pgbench/reads/list.sql")),
    (Scenario::Events, include_str!("../pgbench/reads/events.sql")),
];

/// The design floor's scripts (`pgbench/design/README.md`).
pub mod design {
    /// The minimal schema.
    pub const SCHEMA: &str = include_str!("../pgbench/design/schema.sql");
    /// The completed keys `replay_select.sql` reads; `:nkeys` is the count.
    pub const SEED: &str = include_str!("../pgbench/design/seed_replay.sql");
    /// A new payment: two transactions of 2 + 3 statements.
    pub const PAYMENT: &str = include_str!("../pgbench/design/payment_2tx.sql");
    /// A replay: one point `SELECT`.
    pub const REPLAY: &str = include_str!("../pgbench/design/replay_select.sql");
}

/// pgbench, its scripts and the variables they need.
#[derive(Debug)]
pub struct Floor {
    pgbench: PathBuf,
    dir: PathBuf,
    url: String,
    vars: Vec<(&'static str, String)>,
    fanout: u64,
    threads: usize,
    /// Whether the reading scenarios' scripts are there (the project's floor only).
    reads: bool,
}

/// What one pgbench run measured.
#[derive(Debug)]
pub struct FloorRun {
    pub transactions: u64,
    pub failed: u64,
    /// Transactions per second, without connection set-up.
    pub per_second: f64,
    /// Microseconds per transaction, from pgbench's per-transaction log.
    pub latency: Histogram<u64>,
}

impl Floor {
    /// The project's floor: the API's own statements, as `account` with its API key.
    pub fn project(
        work_dir: &Path,
        url: String,
        account: &str,
        key_hash_hex: &str,
        replay_keys: u64,
        fanout: u64,
        threads: usize,
    ) -> anyhow::Result<Self> {
        let vars = vec![
            ("account", account.to_owned()),
            ("key_hash", format!("\\x{key_hash_hex}")),
            ("replay_keys", replay_keys.to_string()),
        ];
        let dir = work_dir.join("pgbench");
        let mut floor =
            Self::with_scripts(&dir, (NEW_SQL, REPLAY_SQL), url, vars, fanout, threads)?;
        for (scenario, script) in READS {
            std::fs::write(dir.join(format!("{}.sql", scenario.name())), script)?;
        }
        floor.reads = true;
        Ok(floor)
    }

    /// Sets a variable of the scripts (`ncursors` once `bench_cursors` holds the reads' cursors).
    pub fn define(&mut self, name: &'static str, value: String) {
        self.vars.retain(|(n, _)| *n != name);
        self.vars.push((name, value));
    }

    /// Whether this floor has a script for `scenario` (the design's has none for the reads).
    pub fn has(&self, scenario: Scenario) -> bool {
        self.reads || !scenario.reads()
    }

    /// The design's floor, on a database that holds `design::SCHEMA` and `replay_keys` keys of
    /// `design::SEED`.
    pub fn design(
        work_dir: &Path,
        url: String,
        replay_keys: u64,
        fanout: u64,
        threads: usize,
    ) -> anyhow::Result<Self> {
        let vars = vec![("nkeys", replay_keys.to_string())];
        let scripts = (design::PAYMENT, design::REPLAY);
        Self::with_scripts(&work_dir.join("pgbench-design"), scripts, url, vars, fanout, threads)
    }

    fn with_scripts(
        dir: &Path,
        (new, replay): (&str, &str),
        url: String,
        vars: Vec<(&'static str, String)>,
        fanout: u64,
        threads: usize,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("new.sql"), new)?;
        std::fs::write(dir.join("replay.sql"), replay)?;
        Ok(Self {
            pgbench: find_pgbench()?,
            dir: dir.to_owned(),
            url,
            vars,
            fanout,
            threads,
            reads: false,
        })
    }

    /// Runs `scenario`'s SQL over `clients` connections for the budget.
    pub async fn run(
        &self,
        scenario: Scenario,
        clients: usize,
        budget: Budget,
    ) -> anyhow::Result<FloorRun> {
        let logs = self.dir.join(format!("log-{}-{clients}", scenario.name()));
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs)?;
        let mut command = tokio::process::Command::new(&self.pgbench);
        command
            .args(["--no-vacuum", "--protocol=prepared", "--log"])
            .arg(format!("--client={clients}"))
            .arg(format!("--jobs={}", self.threads.clamp(1, clients.max(1))))
            .arg(format!("--log-prefix={}", logs.join("tx").display()));
        match budget {
            Budget::Time(d) => command.arg(format!("--time={}", d.as_secs().max(1))),
            Budget::Requests(n) => {
                command.arg(format!("--transactions={}", n.div_ceil(clients as u64)))
            }
        };
        let new = self.dir.join("new.sql");
        let replay = self.dir.join("replay.sql");
        match scenario {
            Scenario::New => command.arg(format!("--file={}", new.display())),
            Scenario::Replay => command.arg(format!("--file={}", replay.display())),
            // One request in `fanout` creates the payment; the others find its key.
            // With one request per key, a storm is `new`.
            Scenario::Storm if self.fanout <= 1 => command.arg(format!("--file={}", new.display())),
            Scenario::Storm => command.arg(format!("--file={}@1", new.display())).arg(format!(
                "--file={}@{}",
                replay.display(),
                self.fanout - 1
            )),
            read => {
                anyhow::ensure!(self.has(read), "no floor script for `{}`", read.name());
                command.arg(format!(
                    "--file={}",
                    self.dir.join(format!("{}.sql", read.name())).display()
                ))
            }
        };
        for (name, value) in &self.vars {
            command.arg(format!("--define={name}={value}"));
        }
        command.arg(&self.url);
        let output = tokio::time::timeout(Duration::from_secs(3600), command.output())
            .await
            .context("pgbench did not finish")??;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "pgbench failed: {}\n{stdout}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let transactions = field(&stdout, "number of transactions actually processed:")?;
        let failed = field(&stdout, "number of failed transactions:").unwrap_or(0.0) as u64;
        let per_second = field(&stdout, "tps =")?;
        Ok(FloorRun {
            transactions: transactions as u64,
            failed,
            per_second,
            latency: read_logs(&logs)?,
        })
    }
}

/// The number after `label` on the line that starts with it (`tps = 123.4 (…)`, `…: 56/56`).
fn field(stdout: &str, label: &str) -> anyhow::Result<f64> {
    let line = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .with_context(|| format!("pgbench printed no `{label}`:\n{stdout}"))?;
    let number: String =
        line.trim().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    number.parse().with_context(|| format!("`{label}{line}`"))
}

/// Every transaction's latency from pgbench's logs (`client tx latency_us script epoch us`).
fn read_logs(dir: &Path) -> anyhow::Result<Histogram<u64>> {
    let mut latency = histogram();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        for line in text.lines() {
            if let Some(us) = line.split_whitespace().nth(2).and_then(|f| f.parse::<u64>().ok()) {
                latency.saturating_record(us.max(1));
            }
        }
    }
    Ok(latency)
}

/// pgbench on the PATH, else in the newest /usr/lib/postgresql/*/bin.
fn find_pgbench() -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("pgbench"))
        .find(|p| p.is_file());
    if let Some(found) = on_path {
        return Ok(found);
    }
    let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| dirs.filter_map(|d| d.ok()).map(|d| d.path().join("bin/pgbench")).collect())
        .unwrap_or_default();
    installed.retain(|p| p.is_file());
    installed.sort();
    installed.pop().context("pgbench is not installed (Debian: apt-get install postgresql-client)")
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: multiple scripts
scaling factor: 1
number of clients: 8
number of threads: 1
number of transactions actually processed: 16000/16000
number of failed transactions: 3 (0.019%)
latency average = 1.061 ms
initial connection time = 9.866 ms
tps = 7542.120350 (without initial connection time)
";

    #[test]
    fn reads_pgbench_summary() {
        assert_eq!(field(OUTPUT, "number of transactions actually processed:").ok(), Some(16000.0));
        assert_eq!(field(OUTPUT, "number of failed transactions:").ok(), Some(3.0));
        assert_eq!(field(OUTPUT, "tps =").ok(), Some(7542.120350));
        assert!(field(OUTPUT, "no such line").is_err());
    }

    #[test]
    fn reads_latencies_from_transaction_logs() {
        let dir = std::env::temp_dir().join(format!("bench-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        std::fs::write(dir.join("tx.1"), "0 0 1000 0 1700000000 1\n0 1 3000 0 1700000000 2\n")
            .unwrap_or_default();
        std::fs::write(dir.join("tx.2"), "1 0 2000 1 1700000000 3\n").unwrap_or_default();
        let latency = read_logs(&dir).map(|h| (h.len(), h.max(), h.min()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(latency.ok(), Some((3, 3001, 1000)));
    }
}
