//! `make proof-ha`: a Postgres failover under load, with the invariants of the proof checked on
//! the new primary. Never part of `make test` (every test here is `#[ignore]`): it needs the
//! cluster of `scripts/ha.sh up` (etcd, two Postgres nodes under Patroni, HAProxy), whose
//! addresses come from `HA_DATABASE_URL` (HAProxy's primary port) and `HA_PATRONI` (the nodes'
//! REST APIs, comma separated).
//!
//! Each round: a fresh database through HAProxy, the stand-in processor, two API processes and
//! one long-running worker; clients create, capture and refund, retrying with the same keys until
//! each request has a final answer; then the fault; then load until every key is final, the
//! completer's pass, a replay of every final answer with its key, and the invariant checker on
//! the new primary and the processor. Four rounds: `synchronous_mode` true and false, each with
//! the primary's postmaster killed (SIGKILL) and with a Patroni switchover.
//!
//! The kill comes while the primary's WAL sender is stopped (SIGSTOP for `PAUSE`; it is killed
//! with the postmaster): the replication link lagging at the moment the primary dies, which on
//! one machine's loopback would otherwise almost never be seen (a paused receiver is not enough:
//! the kernel's socket buffers hold what was sent, and the standby reads it on waking).
//! Synchronous replication makes commits wait through the pause; asynchronous replication
//! acknowledges them, and the proof counts what the promotion then forgets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use payments_tests::system::{Account, Process, System, is_final};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use tokio::sync::Mutex;

/// How long the primary's WAL sender is stopped before the primary is killed.
const PAUSE: Duration = Duration::from_millis(1500);
/// Load before the fault, and after the database is writable again.
const WARM_UP: Duration = Duration::from_secs(4);
const AFTER: Duration = Duration::from_secs(4);
/// Every wait of the proof is bounded by one of these.
const CLUSTER_WAIT: Duration = Duration::from_secs(120);
const REQUEST_DEADLINE: Duration = Duration::from_secs(120);

/// The cluster of `scripts/ha.sh`, through Patroni's REST API.
struct Cluster {
    /// HAProxy's primary port, database `postgres`.
    url: String,
    /// The nodes' REST APIs.
    patroni: Vec<String>,
    http: reqwest::Client,
}

/// A member of the cluster as `GET /cluster` describes it.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    role: String,
    state: String,
    port: u16,
}

impl Cluster {
    fn from_env() -> Self {
        let url = std::env::var("HA_DATABASE_URL")
            .expect("HA_DATABASE_URL is not set: run `make proof-ha` (it starts the cluster)");
        let patroni = std::env::var("HA_PATRONI")
            .expect("HA_PATRONI is not set: run `make proof-ha`")
            .split(',')
            .map(str::to_owned)
            .collect();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().unwrap();
        Self { url, patroni, http }
    }

    async fn members(&self) -> Vec<Member> {
        for api in &self.patroni {
            let Ok(response) = self.http.get(format!("{api}/cluster")).send().await else {
                continue;
            };
            let Ok(cluster) = response.json::<Value>().await else { continue };
            return cluster["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| Member {
                    name: m["name"].as_str().expect("a Patroni member has a name").to_owned(),
                    role: m["role"].as_str().expect("a Patroni member has a role").to_owned(),
                    state: m["state"].as_str().expect("a Patroni member has a state").to_owned(),
                    port: m["port"].as_u64().expect("a Patroni member has a port") as u16,
                })
                .collect();
        }
        Vec::new()
    }

    /// Waits until there is a running leader and the other member streams from it, as a
    /// synchronous standby when `sync`.
    async fn wait_healthy(&self, sync: bool) -> (Member, Member) {
        let deadline = Instant::now() + CLUSTER_WAIT;
        loop {
            let members = self.members().await;
            let leader = members.iter().find(|m| m.role == "leader" && m.state == "running");
            let standby = members.iter().find(|m| {
                m.state == "streaming"
                    && if sync { m.role == "sync_standby" } else { m.role == "replica" }
            });
            if let (Some(leader), Some(standby)) = (leader, standby) {
                return (leader.clone(), standby.clone());
            }
            assert!(Instant::now() < deadline, "the cluster did not settle: {members:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Patroni's `synchronous_mode`, changed in the cluster's configuration (in etcd).
    async fn set_sync(&self, sync: bool) {
        let mut done = false;
        for api in &self.patroni {
            if let Ok(response) = self
                .http
                .patch(format!("{api}/config"))
                .json(&json!({"synchronous_mode": sync}))
                .send()
                .await
                && response.status().is_success()
            {
                done = true;
                break;
            }
        }
        assert!(done, "no Patroni took the configuration");
    }

    /// A Patroni switchover from `leader` to `candidate`, as an operator runs one.
    async fn switchover(&self, leader: &Member, candidate: &Member) {
        let body = json!({"leader": leader.name, "candidate": candidate.name});
        for api in &self.patroni {
            if let Ok(response) =
                self.http.post(format!("{api}/switchover")).json(&body).send().await
                && response.status().is_success()
            {
                return;
            }
        }
        panic!("no Patroni accepted the switchover");
    }

    /// A superuser connection straight to one node (not through HAProxy).
    async fn node(&self, member: &Member) -> sqlx::PgConnection {
        let options: PgConnectOptions = self.url.parse().unwrap();
        options.port(member.port).connect().await.unwrap()
    }

    fn database(&self, name: &str) -> PgConnectOptions {
        let options: PgConnectOptions = self.url.parse().unwrap();
        options.database(name)
    }
}

/// Sends `kill -{signal} {pid}`.
fn signal(signal: &str, pid: i32) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status();
    assert!(status.is_ok_and(|s| s.success()), "kill {signal} {pid} failed");
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL of the primary's postmaster (after stopping its WAL sender).
    Kill,
    /// `POST /switchover` to Patroni.
    Switchover,
}

/// One request a client got a final answer to.
#[derive(Debug, Clone)]
struct Final {
    account: Account,
    path: String,
    key: String,
    body: Value,
    status: u16,
    bytes: Vec<u8>,
}

/// What the clients saw: every answer with its time, and every final one.
#[derive(Default)]
struct Seen {
    /// (when, status; 0 when the connection failed or timed out)
    answers: Vec<(Instant, u16)>,
    finals: Vec<Final>,
}

/// Sends one request until it has a final answer, as a client that retries with the same key
/// does (bounded by `REQUEST_DEADLINE`).
async fn until_final(
    sys: &System,
    apis: &[String],
    seen: &Mutex<Seen>,
    account: &Account,
    path: String,
    key: String,
    body: Value,
) -> Option<Final> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    for attempt in 0usize.. {
        let api = &apis[attempt % apis.len()];
        let answer = sys.post(api, account, &path, &key, &body, Duration::from_secs(10)).await;
        let status = answer.as_ref().map_or(0, |(status, _)| *status);
        seen.lock().await.answers.push((Instant::now(), status));
        if let Some((status, bytes)) = answer
            && is_final(status)
        {
            let done = Final { account: account.clone(), path, key, body, status, bytes };
            seen.lock().await.finals.push(done.clone());
            return Some(done);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50 * (attempt as u64 + 1).min(10))).await;
    }
    None
}

/// One client: payment flows until told to stop (manual capture then a partial capture and a
/// refund, or automatic capture then a refund), every request retried with its key.
async fn client(
    sys: Arc<System>,
    apis: Vec<String>,
    seen: Arc<Mutex<Seen>>,
    account: Account,
    name: String,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut unfinished = 0;
    let mut flow = 0;
    while !stop.load(Ordering::Relaxed) {
        flow += 1;
        let manual = flow % 2 == 0;
        let body = json!({"amount": 1000 + flow, "currency": "usd", "payment_method": "pm_card_visa",
                          "capture_method": if manual { "manual" } else { "automatic" },
                          "receipt_email": "buyer@example.com"});
        let key = format!("{name}-{flow}");
        let Some(created) =
            until_final(&sys, &apis, &seen, &account, "/v1/payments".into(), key.clone(), body)
                .await
        else {
            unfinished += 1;
            continue;
        };
        let Some(id) = serde_json::from_slice::<Value>(&created.bytes).ok().and_then(|v| {
            (created.status == 201).then(|| v["id"].as_str().map(str::to_owned)).flatten()
        }) else {
            continue;
        };
        let mut steps = Vec::new();
        if manual {
            steps.push((format!("/v1/payments/{id}/capture"), json!({"amount_to_capture": 700})));
        }
        steps.push((format!("/v1/payments/{id}/refunds"), json!({"amount": 300})));
        for (n, (path, body)) in steps.into_iter().enumerate() {
            let key = format!("{key}-step{n}");
            if until_final(&sys, &apis, &seen, &account, path, key, body).await.is_none() {
                unfinished += 1;
                break;
            }
        }
    }
    unfinished
}

/// Until the fault is over: a write through HAProxy on a fresh connection every 50 ms;
/// returns when the first one succeeds after `from`, and how long that took.
async fn first_write_after(cluster: &Cluster, database: &str, from: Instant) -> Duration {
    let options = cluster.database(database);
    loop {
        assert!(from.elapsed() < CLUSTER_WAIT, "the database never took a write again");
        let wrote = tokio::time::timeout(Duration::from_secs(1), async {
            let mut conn = options.connect().await?;
            // Assigning a transaction id fails on a standby ("cannot assign TransactionIds
            // during recovery"): this succeeds on a writable primary only.
            sqlx::query("SELECT txid_current()").execute(&mut conn).await?;
            conn.close().await
        })
        .await;
        if matches!(wrote, Ok(Ok(()))) {
            return from.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a round measured.
#[derive(Debug)]
struct Report {
    sync: bool,
    fault: Fault,
    /// From the fault (the kill, or the switchover request) to the first write through HAProxy.
    failover: Duration,
    requests: usize,
    /// Answers 5xx (and broken connections) the clients got, by status, and over how long.
    server_errors: Vec<(u16, usize)>,
    broken: usize,
    error_span: Duration,
    /// Final answers whose replay with the same key differs: the database forgot them.
    lost_answers: usize,
    /// Replays that made a new payment for a create that had been answered 201 before.
    recreated: usize,
    /// Charges at the processor whose payment no longer exists.
    orphan_charges: usize,
    unfinished: usize,
    violations: Vec<String>,
    payments: usize,
    charges: usize,
}

impl Report {
    fn print(&self) {
        let mode = if self.sync { "synchronous_mode=true " } else { "synchronous_mode=false" };
        let fault = match self.fault {
            Fault::Kill => "SIGKILL of the primary's postmaster",
            Fault::Switchover => "Patroni switchover",
        };
        println!("proof-ha: {mode} {fault}");
        println!(
            "  failover: {} ms until the first write through HAProxy",
            self.failover.as_millis()
        );
        let total: usize = self.server_errors.iter().map(|(_, n)| n).sum();
        let by_status: Vec<String> =
            self.server_errors.iter().map(|(status, n)| format!("{n} × {status}")).collect();
        println!(
            "  during it: {total} of {} requests answered 5xx ({}), {} broken connections, over {} ms",
            self.requests,
            by_status.join(", "),
            self.broken,
            self.error_span.as_millis()
        );
        println!(
            "  lost: {} acknowledged answers replay differently, {} creates made a new payment on replay, {} charges belong to no payment",
            self.lost_answers, self.recreated, self.orphan_charges
        );
        println!(
            "  invariants: {} violations over {} payments and {} charges{}",
            self.violations.len(),
            self.payments,
            self.charges,
            if self.unfinished > 0 {
                format!(" ({} requests never got a final answer)", self.unfinished)
            } else {
                String::new()
            }
        );
        // The violations by kind, then the first few as the checker wrote them.
        let mut kinds: Vec<(&str, usize)> = Vec::new();
        for violation in &self.violations {
            let kind = VIOLATION_KINDS
                .iter()
                .find(|(needle, _)| violation.contains(needle))
                .map_or("other", |(_, kind)| *kind);
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((kind, 1)),
            }
        }
        for (kind, n) in kinds {
            println!("    {n} × {kind}");
        }
        for violation in self.violations.iter().take(5) {
            println!("    e.g. {violation}");
        }
    }
}

/// The checker's messages (`tests/src/invariants.rs`) by what they mean.
const VIOLATION_KINDS: [(&str, &str); 8] = [
    ("belongs to no payment", "charge at the processor whose payment the database forgot"),
    ("different final answers", "key answered differently on replay"),
    ("successful charges", "payment with other than one successful charge"),
    ("which does not exist", "201 naming a payment that does not exist"),
    ("refund", "over-refund"),
    ("unfinished and not flagged", "keys unfinished and not flagged"),
    ("processing, and no key", "payment left processing"),
    ("receipts", "payment without its one receipt"),
];

async fn round(cluster: &Cluster, sync: bool, fault: Fault) -> Report {
    cluster.set_sync(sync).await;
    let (leader, standby) = cluster.wait_healthy(sync).await;

    // A fresh database on the primary, migrated through HAProxy.
    let database = format!(
        "payments_ha_{}_{}",
        if sync { "sync" } else { "async" },
        match fault {
            Fault::Kill => "kill",
            Fault::Switchover => "switchover",
        }
    );
    let mut admin = cluster.database("postgres").connect().await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {database}")).execute(&mut admin).await.unwrap();
    admin.close().await.unwrap();
    let pool: PgPool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(cluster.database(&database))
        .await
        .unwrap();
    payments_api::MIGRATOR.run(&pool).await.unwrap();

    let sys = Arc::new(System::start(pool).await);
    let settings = [("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "10000")];
    let apis = [sys.api_with("", &settings).await, sys.api_with("", &settings).await];
    let urls: Vec<String> = apis.iter().map(|a| a.url.clone()).collect();
    let worker: Process = sys.worker(&[("PAYMENTS__WORKER__INTERVAL_MS", "200")]);
    let accounts = [sys.account("a").await, sys.account("b").await];

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            tokio::spawn(client(
                sys.clone(),
                urls.clone(),
                seen.clone(),
                accounts[c % accounts.len()].clone(),
                format!("c{c}"),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;

    let started = match fault {
        Fault::Kill => {
            let mut primary_conn = cluster.node(&leader).await;
            let sender: i32 = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_replication WHERE application_name = $1",
            )
            .bind(&standby.name)
            .fetch_one(&mut primary_conn)
            .await
            .unwrap();
            let pid_file: String = sqlx::query_scalar("SELECT pg_read_file('postmaster.pid')")
                .fetch_one(&mut primary_conn)
                .await
                .unwrap();
            let postmaster: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
            drop(primary_conn);
            // The replication link stalls, then the machine dies: the WAL sender, stopped, never
            // sends what it had not sent yet.
            signal("-STOP", sender);
            tokio::time::sleep(PAUSE).await;
            let started = Instant::now();
            signal("-KILL", postmaster);
            signal("-KILL", sender);
            started
        }
        Fault::Switchover => {
            let started = Instant::now();
            cluster.switchover(&leader, &standby).await;
            started
        }
    };
    let failover = first_write_after(cluster, &database, started).await;
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    let mut unfinished = 0;
    for client in clients {
        unfinished += tokio::time::timeout(REQUEST_DEADLINE * 4, client)
            .await
            .expect("a client never finished")
            .unwrap();
    }
    // The cluster is whole again before anything is checked (the old primary rejoins).
    cluster.wait_healthy(sync).await;

    // Every final answer replayed with its key first: a replay that runs a forgotten request
    // again leaves work (a receipt, say) for the pass below.
    let finals = seen.lock().await.finals.clone();
    let (mut lost_answers, mut recreated) = (0, 0);
    for done in &finals {
        let again = until_final(
            &sys,
            &urls,
            &seen,
            &done.account,
            done.path.clone(),
            done.key.clone(),
            done.body.clone(),
        )
        .await;
        if again.as_ref().is_none_or(|a| (a.status, &a.bytes) != (done.status, &done.bytes)) {
            lost_answers += 1;
            if done.path == "/v1/payments" && again.is_some_and(|a| a.status == 201) {
                recreated += 1;
            }
        }
    }
    // Then the completer's pass over whatever is left (the replays' own work included). A job
    // the failover interrupted waits out its backoff; it is made due now, as time would.
    drop(worker);
    sys.expire_leases().await;
    sys.make_due().await;
    sqlx::query("UPDATE jobs SET run_at = now() WHERE done_at IS NULL AND dead_at IS NULL")
        .execute(&sys.pool)
        .await
        .unwrap();
    assert!(sys.worker_once().await.success(), "the worker's pass failed");
    let (violations, checked) = sys.invariant_violations(true).await;
    let orphan_charges = violations.iter().filter(|v| v.contains("belongs to no payment")).count();

    let seen = seen.lock().await;
    let errors: Vec<Instant> = seen
        .answers
        .iter()
        .filter(|(_, status)| *status >= 500 || *status == 0)
        .map(|(at, _)| *at)
        .collect();
    let error_span = match (errors.iter().min(), errors.iter().max()) {
        (Some(first), Some(last)) => *last - *first,
        _ => Duration::ZERO,
    };
    Report {
        sync,
        fault,
        failover,
        requests: seen.answers.len(),
        server_errors: {
            let mut counts: Vec<(u16, usize)> = Vec::new();
            for (_, status) in seen.answers.iter().filter(|(_, s)| *s >= 500) {
                match counts.iter_mut().find(|(s, _)| s == status) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((*status, 1)),
                }
            }
            counts.sort_unstable();
            counts
        },
        broken: seen.answers.iter().filter(|(_, s)| *s == 0).count(),
        error_span,
        lost_answers,
        recreated,
        orphan_charges,
        unfinished,
        violations,
        payments: checked.payments,
        charges: checked.charges,
    }
}

/// Synchronous replication: whichever way the primary goes, nothing acknowledged is lost and
/// every invariant holds on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the cluster of scripts/ha.sh: run `make proof-ha`"]
async fn a_failover_with_synchronous_replication_loses_nothing() {
    let cluster = Cluster::from_env();
    for fault in [Fault::Kill, Fault::Switchover] {
        let report = round(&cluster, true, fault).await;
        report.print();
        assert_eq!(report.unfinished, 0, "every request got a final answer");
        assert_eq!(report.lost_answers, 0, "every final answer replays byte for byte");
        assert!(report.violations.is_empty(), "invariants violated: {:#?}", report.violations);
    }
}

/// Asynchronous replication: the same faults, measured rather than asserted (what is lost when
/// the primary dies is the point of the run); a switchover still loses nothing, since Patroni
/// stops the primary cleanly and the standby receives all of its WAL first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the cluster of scripts/ha.sh: run `make proof-ha`"]
async fn a_failover_with_asynchronous_replication_is_measured() {
    let cluster = Cluster::from_env();
    for fault in [Fault::Kill, Fault::Switchover] {
        let report = round(&cluster, false, fault).await;
        report.print();
        if fault == Fault::Switchover {
            assert_eq!(report.lost_answers, 0, "a switchover loses nothing");
            assert!(report.violations.is_empty(), "invariants violated: {:#?}", report.violations);
        }
    }
    // Back to the production setting for whatever runs next.
    cluster.set_sync(true).await;
}
