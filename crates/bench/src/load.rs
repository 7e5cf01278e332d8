//! The load generator: a fixed number of connections, each sending one request after another for
//! a fixed time (or until a request budget is spent), every latency in an HDR histogram.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;

use crate::Scenario;

/// The body every benchmark payment is created with.
pub const BODY: &str = r#"{"amount":1000,"currency":"usd","payment_method":"pm_card_visa"}"#;

/// Where the requests go and who sends them.
#[derive(Clone)]
pub struct Target {
    /// `http://127.0.0.1:port/v1/payments`
    pub url: String,
    /// The account's secret key. Never printed.
    pub secret: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("url", &self.url).finish_non_exhaustive()
    }
}

/// Which idempotency key the request numbered `n` of a run sends.
#[derive(Debug, Clone)]
pub struct Keys {
    pub scenario: Scenario,
    /// Makes a run's fresh keys its own.
    pub run: String,
    /// How many completed keys `replay` cycles through (created by [`preload`]).
    pub replay_keys: u64,
    /// How many requests share a key in `storm`.
    pub fanout: u64,
    /// What the reading scenarios (`get`, `list`, `events`) ask for, in turn: paths with their
    /// query strings.
    pub paths: Arc<[String]>,
}

/// What the request numbered `n` of a run is.
#[derive(Debug, PartialEq, Eq)]
enum Ask {
    /// `POST /v1/payments` with this idempotency key.
    Create(String),
    /// `GET` of this path.
    Read(String),
}

impl Keys {
    fn key(&self, n: u64) -> String {
        match self.scenario {
            Scenario::Replay => replay_key(n % self.replay_keys.max(1)),
            Scenario::Storm => format!("{}-{}", self.run, n / self.fanout.max(1)),
            _ => format!("{}-{n}", self.run),
        }
    }

    fn ask(&self, n: u64) -> Ask {
        if self.scenario.reads() {
            let len = self.paths.len().max(1) as u64;
            Ask::Read(self.paths.get((n % len) as usize).cloned().unwrap_or_default())
        } else {
            Ask::Create(self.key(n))
        }
    }
}

/// The key of the `i`th completed payment that `replay` asks for again.
/// Plain numbers, so that pgbench (which has no string variables) can send the same keys.
pub fn replay_key(i: u64) -> String {
    i.to_string()
}

/// When a run stops.
#[derive(Debug, Clone, Copy)]
pub enum Budget {
    Time(Duration),
    Requests(u64),
}

/// What a run measured.
#[derive(Debug)]
pub struct Outcome {
    pub requests: u64,
    pub elapsed: Duration,
    /// Microseconds per request, as the client saw it.
    pub latency: Histogram<u64>,
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no HTTP answer at all.
    pub errors: u64,
}

impl Outcome {
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Sends requests over `connections` keep-alive connections until the budget is spent.
pub async fn run(
    target: &Target,
    keys: &Keys,
    connections: usize,
    budget: Budget,
) -> anyhow::Result<Outcome> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let (deadline, limit) = match budget {
        Budget::Time(d) => (started + d, u64::MAX),
        Budget::Requests(n) => (started + Duration::from_secs(3600), n),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (target, keys, next) = (target.clone(), keys.clone(), next.clone());
        tasks.spawn(async move { connection(target, keys, next, deadline, limit).await });
    }
    let mut total = Outcome {
        requests: 0,
        elapsed: Duration::ZERO,
        latency: histogram(),
        statuses: BTreeMap::new(),
        errors: 0,
    };
    while let Some(joined) = tasks.join_next().await {
        let one = joined.context("a load connection panicked")??;
        total.requests += one.requests;
        total.errors += one.errors;
        total.latency.add(&one.latency).context("merging latency histograms")?;
        for (status, count) in one.statuses {
            *total.statuses.entry(status).or_default() += count;
        }
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

/// One connection's loop: the next request number, its key, send, wait for the whole answer.
///
/// Plain hyper on one HTTP/1.1 connection, not reqwest: the load generator shares the two cores
/// with the system under test, and every microsecond it spends is charged to the API's side of
/// the ratio (pgbench, on the floor's side, is lean C).
async fn connection(
    target: Target,
    keys: Keys,
    next: Arc<AtomicU64>,
    deadline: Instant,
    limit: u64,
) -> anyhow::Result<Outcome> {
    let uri: http::Uri = target.url.parse().context("the target URL")?;
    let authority = uri.authority().context("the target URL has no host")?.clone();
    let authorization = http::HeaderValue::try_from(format!("Bearer {}", target.secret))?;
    let mut sender = None;
    let mut outcome = Outcome {
        requests: 0,
        elapsed: Duration::ZERO,
        latency: histogram(),
        statuses: BTreeMap::new(),
        errors: 0,
    };
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= limit || Instant::now() >= deadline {
            return Ok(outcome);
        }
        let sent = Instant::now();
        if sender.is_none() {
            sender = Some(connect(authority.as_str()).await?);
        }
        let request = match keys.ask(n) {
            Ask::Create(key) => http::Request::post(uri.path())
                .header(http::header::HOST, authority.as_str())
                .header(http::header::AUTHORIZATION, authorization.clone())
                .header("idempotency-key", key)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from_static(BODY.as_bytes())))?,
            Ask::Read(path) => http::Request::get(path)
                .header(http::header::HOST, authority.as_str())
                .header(http::header::AUTHORIZATION, authorization.clone())
                .body(Full::new(Bytes::new()))?,
        };
        let answer = match sender.as_mut() {
            Some(sender) => exchange(sender, request).await,
            None => Err(anyhow::anyhow!("not connected")),
        };
        match answer {
            Ok(status) => *outcome.statuses.entry(status).or_default() += 1,
            Err(_) => {
                // Counted, and the next request gets a new connection.
                outcome.errors += 1;
                sender = None;
            }
        }
        outcome.requests += 1;
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        outcome.latency.saturating_record(micros.max(1));
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A keep-alive HTTP/1.1 connection, driven by a task of its own.
async fn connect(authority: &str) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(authority).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends one request and reads the whole answer; returns its status.
async fn exchange(sender: &mut Sender, request: http::Request<Full<Bytes>>) -> anyhow::Result<u16> {
    sender.ready().await?;
    let response = tokio::time::timeout(Duration::from_secs(30), async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        anyhow::Ok(status)
    });
    response.await?
}

/// Microseconds from 1 µs to 60 s at 3 significant digits.
#[allow(clippy::expect_used)] // constant bounds that hdrhistogram accepts
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Creates the completed payments that `replay` asks for again, over a few connections.
pub async fn preload(target: &Target, count: u64) -> anyhow::Result<()> {
    let keys = Keys {
        scenario: Scenario::Replay,
        run: String::new(),
        replay_keys: count,
        fanout: 1,
        paths: Arc::from([]),
    };
    let outcome = run(target, &keys, 8, Budget::Requests(count)).await?;
    let created = outcome.statuses.get(&201).copied().unwrap_or(0);
    anyhow::ensure!(
        created == count,
        "preloading {count} payments for `replay` got {:?} and {} errors",
        outcome.statuses,
        outcome.errors
    );
    Ok(())
}

/// Sends `count` charges straight to processor-sim, each with its own idempotency key, as
/// payments-api would (so the stand-in keeps the charge and the key's record).
pub async fn charges(sim_url: &str, count: u64) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (next, url) = (next.clone(), format!("{sim_url}/v1/charges"));
        tasks.spawn(async move {
            let client = reqwest::Client::builder().pool_max_idle_per_host(1).build()?;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return anyhow::Ok(());
                }
                let form = format!(
                    "amount=1000&currency=usd&source=pm_card_visa&capture=true\
                     &metadata%5Bpayment_id%5D=pay_memory{n}"
                );
                let response = client
                    .post(&url)
                    .bearer_auth("sk_test_processor")
                    .header("Idempotency-Key", format!("pay_memory{n}/charge"))
                    .header("Content-Type", "application/x-www-form-urlencoded")
                    .body(form)
                    .send()
                    .await?;
                anyhow::ensure!(
                    response.status().is_success(),
                    "processor-sim: {}",
                    response.status()
                );
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a charge sender panicked")??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(scenario: Scenario) -> Keys {
        let paths = Arc::from(["/v1/a".to_owned(), "/v1/b".to_owned()]);
        Keys { scenario, run: "r".into(), replay_keys: 3, fanout: 4, paths }
    }

    #[test]
    fn each_scenario_picks_its_keys() {
        let new: Vec<String> = (0..3).map(|n| keys(Scenario::New).key(n)).collect();
        assert_eq!(new, ["r-0", "r-1", "r-2"]);
        let replay: Vec<String> = (0..4).map(|n| keys(Scenario::Replay).key(n)).collect();
        assert_eq!(replay, ["0", "1", "2", "0"]);
        let storm: Vec<String> = (0..9).map(|n| keys(Scenario::Storm).key(n)).collect();
        assert_eq!(storm, ["r-0", "r-0", "r-0", "r-0", "r-1", "r-1", "r-1", "r-1", "r-2"]);
        let reads: Vec<Ask> = (0..3).map(|n| keys(Scenario::List).ask(n)).collect();
        let read = |p: &str| Ask::Read(p.to_owned());
        assert_eq!(reads, [read("/v1/a"), read("/v1/b"), read("/v1/a")]);
        assert_eq!(keys(Scenario::New).ask(5), Ask::Create("r-5".into()));
    }

    #[test]
    fn a_target_prints_no_secret_key() {
        let target =
            Target { url: "http://127.0.0.1:1/v1/payments".into(), secret: "sk_x9".into() };
        let printed = format!("{target:?}");
        assert!(printed.contains("127.0.0.1:1") && !printed.contains("sk_x9"), "{printed}");
    }
}
