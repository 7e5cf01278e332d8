//! The system under proof: the real `payments-api`, `payments-worker` and `processor-sim`
//! binaries as child processes on free ports against a fresh database, a client ledger of every
//! answer. The invariant checker over them is `crate::invariants`.
#![allow(clippy::expect_used)] // test support: a failed start or read is a failed test

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

/// The seed of the processor's faults; `PROOF_SEED` changes it for longer local runs.
pub fn seed() -> u64 {
    std::env::var("PROOF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42)
}

/// A multiplier of request counts; `PROOF_SCALE` raises it for longer local runs (`make proof`).
pub fn scale() -> usize {
    std::env::var("PROOF_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

/// Where cargo put the binaries: next to the directory of this test executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("the test sits in target/*/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace` first (make test does)",
        path.display()
    );
    path
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The URL of the database a pool is connected to.
pub fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    )
}

/// A child process whose standard error is collected line by line.
#[derive(Debug)]
pub struct Process {
    child: Child,
    /// `http://127.0.0.1:{port}`
    pub url: String,
    lines: Arc<Mutex<Vec<String>>>,
    new_line: Arc<Notify>,
}

impl Process {
    /// Starts `bin` with `args` and `env`, listening on `port`.
    pub fn start(bin: &str, args: &[&str], env: &[(&str, String)], port: u16) -> Self {
        let mut command = Command::new(binary(bin));
        command
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => panic!("cannot start {bin}: {err}"),
        };
        let lines = Arc::new(Mutex::new(Vec::new()));
        let new_line = Arc::new(Notify::new());
        if let Some(stderr) = child.stderr.take() {
            let (lines, new_line, bin) = (lines.clone(), new_line.clone(), bin.to_owned());
            tokio::spawn(async move {
                let mut reader = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    if std::env::var_os("TEST_LOG").is_some() {
                        eprintln!("[{bin}] {line}");
                    }
                    lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
                    new_line.notify_waiters();
                }
            });
        }
        Self { child, url: format!("http://127.0.0.1:{port}"), lines, new_line }
    }

    /// Waits until a line of standard error contains `needle`.
    pub async fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.new_line.notified();
            if self
                .lines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .any(|l| l.contains(needle))
            {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Waits until `GET {url}{path}` answers 200.
    pub async fn wait_ready(&self, path: &str) {
        let http = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(response) = http.get(format!("{}{path}", self.url)).send().await
                && response.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{} never became ready: {:?}", self.url, self.lines.lock().map(|l| l.clone()));
    }

    /// Everything the process printed so far, for a failing test's message.
    pub fn log(&self) -> String {
        self.lines.lock().map(|lines| lines.join("\n")).unwrap_or_default()
    }

    /// SIGKILL: the process dies where it stands, as in a crash.
    pub async fn kill9(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }
}

/// The answers to one (secret key, request) pair: status and body bytes.
pub(crate) type Answers = HashMap<(String, String), Vec<(u16, Vec<u8>)>>;

/// Every answer clients received, by (account key, idempotency key).
#[derive(Debug, Default, Clone)]
pub struct ClientLedger(Arc<Mutex<Answers>>);

impl ClientLedger {
    /// Records an answer.
    pub fn record(&self, secret: &str, key: &str, status: u16, body: Vec<u8>) {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry((secret.to_owned(), key.to_owned())).or_default().push((status, body));
    }

    /// Every status received, in no particular order.
    pub fn statuses(&self) -> Vec<u16> {
        let map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.values().flatten().map(|(status, _)| *status).collect()
    }

    pub(crate) fn snapshot(&self) -> Answers {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// A fresh database, the stand-in processor, and the means to start the other binaries.
#[derive(Debug)]
pub struct System {
    /// The test database.
    pub pool: PgPool,
    /// Its URL, for the child processes.
    pub db_url: String,
    /// The stand-in processor.
    pub sim: Process,
    /// Every answer clients received.
    pub ledger: ClientLedger,
    /// A client without a timeout of its own.
    pub http: reqwest::Client,
}

/// An account: its id and secret key.
#[derive(Clone)]
pub struct Account {
    /// `acct_…`
    pub id: String,
    /// `sk_test_…`. Never printed.
    pub secret: String,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account").field("id", &self.id).finish_non_exhaustive()
    }
}

impl System {
    /// Starts the stand-in processor with a fresh state over `pool`'s database.
    pub async fn start(pool: PgPool) -> Self {
        let port = free_port();
        let sim = Process::start(
            "processor-sim",
            &["--port", &port.to_string(), "--seed", &seed().to_string()],
            &[],
            port,
        );
        sim.wait_ready("/_sim/stats").await;
        let db_url = database_url(&pool);
        Self { pool, db_url, sim, ledger: ClientLedger::default(), http: reqwest::Client::new() }
    }

    fn common_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("DATABASE_URL", self.db_url.clone()),
            ("PAYMENTS__PROCESSOR__BASE_URL", self.sim.url.clone()),
            ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "1000".into()),
            ("PAYMENTS__PROCESSOR__MAX_RETRIES", "1".into()),
            ("PAYMENTS__PROCESSOR__BACKOFF_BASE_MS", "5".into()),
            ("PAYMENTS__PROCESSOR__BACKOFF_CAP_MS", "20".into()),
            ("PAYMENTS__PROCESSOR__RETRY_AFTER_CAP_MS", "50".into()),
            ("PAYMENTS__DATABASE__ACQUIRE_TIMEOUT_MS", "1000".into()),
            ("PAYMENTS__LOG__FILTER", "warn".into()),
            (crate::SEALING_KEY.0, crate::SEALING_KEY.1.into()),
            // Several servers run at once: each admin listener on a free port.
            ("PAYMENTS__HTTP__ADMIN_PORT", "0".into()),
        ]
    }

    /// Starts an API process with the given failpoints (`""` for none); waits until it serves.
    pub async fn api(&self, failpoints: &str) -> Process {
        self.api_with(failpoints, &[]).await
    }

    /// Starts an API process with failpoints and further settings (`PAYMENTS__…` pairs), as a
    /// release configured differently would run.
    pub async fn api_with(&self, failpoints: &str, settings: &[(&'static str, &str)]) -> Process {
        let port = free_port();
        let mut env = self.common_env();
        env.push((crate::ONE_ADDRESS.0, crate::ONE_ADDRESS.1.to_owned()));
        env.extend(settings.iter().map(|(name, value)| (*name, (*value).to_owned())));
        env.push(("PAYMENTS__HTTP__PORT", port.to_string()));
        env.push(("PAYMENTS_FAILPOINTS", failpoints.to_owned()));
        let api = Process::start("payments-api", &["serve"], &env, port);
        api.wait_ready("/readyz").await;
        api
    }

    /// Runs one pass of the worker as its own process; returns how it exited.
    pub async fn worker_once(&self) -> ExitStatus {
        self.worker_once_with(&[]).await
    }

    /// As [`System::worker_once`], with further settings (`PAYMENTS__…` pairs).
    pub async fn worker_once_with(&self, settings: &[(&'static str, &str)]) -> ExitStatus {
        let mut env = self.common_env();
        env.extend(settings.iter().map(|(name, value)| (*name, (*value).to_owned())));
        let mut worker = Process::start("payments-worker", &["--once"], &env, 0);
        match tokio::time::timeout(Duration::from_secs(60), worker.wait()).await {
            Ok(Ok(status)) => status,
            other => panic!("the worker did not finish: {other:?}"),
        }
    }

    /// Starts the worker as a long-running process (the completer, the reaper and the job runner
    /// in a loop), as a deployment runs it; it stops when the returned process is dropped.
    pub fn worker(&self, settings: &[(&'static str, &str)]) -> Process {
        let mut env = self.common_env();
        env.push(("PAYMENTS__WORKER__METRICS_PORT", "0".into()));
        env.extend(settings.iter().map(|(name, value)| (*name, (*value).to_owned())));
        Process::start("payments-worker", &[], &env, 0)
    }

    /// Creates an account directly in the database.
    pub async fn account(&self, name: &str) -> Account {
        match payments_domain::accounts::create_account(&self.pool, name).await {
            Ok((account, _, secret)) => {
                Account { id: account.id.to_string(), secret: secret.expose().to_owned() }
            }
            Err(err) => panic!("cannot create an account: {err}"),
        }
    }

    /// Sets the processor's faults.
    pub async fn faults(&self, faults: Value) {
        let response =
            self.http.put(format!("{}/_sim/faults", self.sim.url)).json(&faults).send().await;
        assert!(
            response.is_ok_and(|r| r.status().is_success()),
            "the processor refused the faults"
        );
    }

    /// Moves every live lease into the past, as if its holder had stalled that long.
    pub async fn expire_leases(&self) {
        let moved = sqlx::query(
            "UPDATE idempotency_keys SET locked_until = now() - interval '1 second', next_attempt_at = now() \
             WHERE locked_until IS NOT NULL",
        )
        .execute(&self.pool)
        .await;
        assert!(moved.is_ok(), "{moved:?}");
    }

    /// Makes every released key due for the completer now.
    pub async fn make_due(&self) {
        let moved = sqlx::query(
            "UPDATE idempotency_keys SET next_attempt_at = now() WHERE completed_at IS NULL",
        )
        .execute(&self.pool)
        .await;
        assert!(moved.is_ok(), "{moved:?}");
    }

    /// Sends one POST, records the answer in the ledger, and returns it (`None` when the
    /// connection failed or timed out: the client cannot know what happened).
    pub async fn post(
        &self,
        api: &str,
        account: &Account,
        path: &str,
        key: &str,
        body: &Value,
        timeout: Duration,
    ) -> Option<(u16, Vec<u8>)> {
        let sent = self
            .http
            .post(format!("{api}{path}"))
            .bearer_auth(&account.secret)
            .header("idempotency-key", key)
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .ok()?;
        let status = sent.status().as_u16();
        let bytes = sent.bytes().await.ok()?.to_vec();
        self.ledger.record(&account.secret, &format!("{path} {key}"), status, bytes.clone());
        Some((status, bytes))
    }

    /// Sends a POST until it has a final answer (anything but 409, 429, 5xx or a broken
    /// connection), as a well-behaved client does; gives up after `tries`.
    pub async fn post_until_final(
        &self,
        api: &str,
        account: &Account,
        path: &str,
        key: &str,
        body: &Value,
        tries: usize,
    ) -> Option<(u16, Vec<u8>)> {
        for attempt in 0..tries {
            if let Some((status, bytes)) =
                self.post(api, account, path, key, body, Duration::from_secs(10)).await
                && is_final(status)
            {
                return Some((status, bytes));
            }
            tokio::time::sleep(Duration::from_millis(20 * (attempt as u64 + 1).min(10))).await;
        }
        None
    }

    /// Every status clients received.
    pub fn ledger_statuses(&self) -> Vec<u16> {
        self.ledger.statuses()
    }

    /// Every charge the processor holds, newest first.
    pub async fn charges(&self) -> Vec<Value> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = format!("{}/v1/charges?limit=100", self.sim.url);
            if let Some(after) = &after {
                url.push_str(&format!("&starting_after={after}"));
            }
            let response = self.http.get(url).bearer_auth("sk_test_proof").send().await;
            let page: Value = response
                .expect("listing the processor's charges")
                .json()
                .await
                .expect("the processor's list of charges");
            let data = page["data"].as_array().cloned().expect("a list of charges has `data`");
            after = data.last().and_then(|c| c["id"].as_str()).map(str::to_owned);
            all.extend(data);
            if page["has_more"] != json!(true) {
                return all;
            }
        }
    }

    /// The processor's counters.
    pub async fn sim_stats(&self) -> Value {
        let response = self.http.get(format!("{}/_sim/stats", self.sim.url)).send().await;
        response
            .expect("reading the processor's stats")
            .json()
            .await
            .expect("the processor's stats")
    }
}

/// Whether a status is a final answer (stored and replayed) rather than "try again".
pub fn is_final(status: u16) -> bool {
    !(status == 409 || status == 429 || status >= 500)
}
