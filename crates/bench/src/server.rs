//! The system under test: a fresh database with one role per party (so `pg_stat_statements` can
//! tell the API's statements from the worker's and pgbench's), and the real binaries as child
//! processes.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The database the benchmark makes, and drops at its next run.
pub const DATABASE: &str = "payments_bench";

/// The roles the parties connect as. Each is a superuser of the benchmark's own server.
pub const API_ROLE: &str = "bench_api";
pub const WORKER_ROLE: &str = "bench_worker";
pub const FLOOR_ROLE: &str = "bench_floor";

/// The benchmark database and the URLs each party connects with.
#[derive(Debug)]
pub struct Database {
    pub options: PgConnectOptions,
    pub pool: PgPool,
}

impl Database {
    /// Drops and recreates the database [`DATABASE`] on the server `url` names (whatever
    /// database the URL names, so that a mistyped URL cannot drop anything else), makes the
    /// roles and checks that `pg_stat_statements` is loaded.
    pub async fn fresh(url: &str) -> anyhow::Result<Self> {
        let options = PgConnectOptions::from_str(url).context("BENCH_DATABASE_URL")?;
        let name = DATABASE;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone().database("postgres"))
            .await
            .with_context(|| format!("connecting to {}", options.to_url_lossy()))?;
        let preload: String =
            sqlx::query_scalar("SELECT current_setting('shared_preload_libraries')")
                .fetch_one(&admin)
                .await?;
        if !preload.contains("pg_stat_statements") {
            bail!(
                "the server at {} does not preload pg_stat_statements (shared_preload_libraries = \
                 '{preload}'); `make bench` starts a private server that does",
                options.to_url_lossy()
            );
        }
        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&admin)
            .await?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\"")).execute(&admin).await?;
        for role in [API_ROLE, WORKER_ROLE, FLOOR_ROLE] {
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                    .bind(role)
                    .fetch_one(&admin)
                    .await?;
            if !exists {
                sqlx::query(&format!("CREATE ROLE {role} LOGIN SUPERUSER")).execute(&admin).await?;
            }
        }
        admin.close().await;
        let options = options.database(name);
        let pool = PgPoolOptions::new().max_connections(2).connect_with(options.clone()).await?;
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&pool).await?;
        Ok(Self { options, pool })
    }

    /// The URL `role` connects with (trust authentication: the benchmark's server is private).
    pub fn url_as(&self, role: &str) -> String {
        format!(
            "postgres://{role}@{}:{}/{}",
            self.options.get_host(),
            self.options.get_port(),
            self.options.get_database().unwrap_or_default()
        )
    }

    /// The superuser's URL.
    pub fn url(&self) -> String {
        self.url_as(self.options.get_username())
    }
}

/// A child process of the benchmark; killed when dropped.
#[derive(Debug)]
pub struct Process {
    pub name: &'static str,
    child: Child,
}

impl Process {
    /// Starts `bin_dir/name args…` with `env`, its output in `logs/name.log`.
    pub fn start(
        bin_dir: &Path,
        logs: &Path,
        name: &'static str,
        args: &[&str],
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let log = File::create(logs.join(format!("{name}.log")))?;
        let child = Command::new(bin_dir.join(name))
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin_dir.join(name).display()))?;
        Ok(Self { name, child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory so far, from `/proc/<pid>/status` (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        proc_status(self.pid(), "VmHWM:")
    }

    /// Resident memory now (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        proc_status(self.pid(), "VmRSS:")
    }

    /// Stops the process in its tracks (SIGSTOP) or lets it go on (SIGCONT).
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.pid().to_string()).status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {} failed", self.name);
        Ok(())
    }

    /// Fails if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}); see its log", self.name);
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.signal("CONT");
        let _ = self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `bin_dir/name args…` to completion and returns its standard output.
pub fn run_to_end(
    bin_dir: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, String)],
) -> anyhow::Result<String> {
    let output = Command::new(bin_dir.join(name))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {name}"))?;
    anyhow::ensure!(output.status.success(), "{name} {args:?} failed: {}", output.status);
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Waits until `url` answers 200.
pub async fn wait_ready(url: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(response) = client.get(url).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{url} did not answer in 30 s")
}

/// A free loopback port.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The directory of this executable: where cargo put its sibling binaries.
pub fn own_dir() -> PathBuf {
    std::env::current_exe().ok().and_then(|exe| exe.parent().map(PathBuf::from)).unwrap_or_default()
}

/// CPU time spent so far, in clock ticks (1/100 s on Linux), by the parties of a run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu {
    /// payments-api.
    pub api: u64,
    /// processor-sim.
    pub sim: u64,
    /// This process: the load generator.
    pub load: u64,
    /// This process's waited-for children: pgbench.
    pub pgbench: u64,
    /// Every `postgres` process of the machine: the backends, and through the postmasters'
    /// children's time, the backends that have exited (pgbench's, at the end of its run).
    pub postgres: u64,
}

impl Cpu {
    /// Reads the counters now.
    pub fn now(api: u32, sim: u32) -> Self {
        let own = stat_fields(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default());
        let field = |fields: &[u64], i: usize| fields.get(i).copied().unwrap_or(0);
        let mut postgres = 0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if stat.contains("(postgres)") {
                // A backend that has exited counts in its postmaster's children's time.
                postgres += stat_fields(&stat).iter().sum::<u64>();
            }
        }
        let of = |pid: u32| {
            let fields = stat_fields(
                &std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default(),
            );
            field(&fields, 0) + field(&fields, 1)
        };
        Self {
            api: of(api),
            sim: of(sim),
            load: field(&own, 0) + field(&own, 1),
            pgbench: field(&own, 2) + field(&own, 3),
            postgres,
        }
    }

    /// What was spent between `self` and `later`.
    pub fn until(self, later: Self) -> Self {
        Self {
            api: later.api.saturating_sub(self.api),
            sim: later.sim.saturating_sub(self.sim),
            load: later.load.saturating_sub(self.load),
            pgbench: later.pgbench.saturating_sub(self.pgbench),
            postgres: later.postgres.saturating_sub(self.postgres),
        }
    }
}

/// utime, stime, cutime, cstime of a `/proc/<pid>/stat` line (fields 14 to 17; the command name
/// in parentheses may hold spaces, so counting starts after the last `)`).
fn stat_fields(stat: &str) -> Vec<u64> {
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    rest.split_whitespace().skip(11).take(4).filter_map(|f| f.parse().ok()).collect()
}
