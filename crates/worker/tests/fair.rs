//! The fair worker against a real Postgres and receivers on loopback: deliveries run concurrently
//! under caps per endpoint and per account (across workers), due deliveries are taken round-robin
//! across accounts, an endpoint that keeps failing is paused and then disabled with an event, and
//! a delivery stuck on a silent receiver delays neither receipts nor the reaper.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use payments_domain::deliveries::{self, Caps};
use payments_domain::events::{self, EventType};
use payments_domain::webhooks::{self, EnabledEvents, EndpointStatus, SealingKeys};
use payments_domain::{AccountId, WebhookEndpointId};
use payments_settings::Settings;
use payments_testkit::{WAIT, eventually};
use payments_worker::Worker;
use payments_worker::jobs::{Mailer, Receipt};
use provider::ProcessorClient;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

/// Counts receipts sent.
#[derive(Default)]
struct CountingMailer {
    sent: AtomicUsize,
}

impl Mailer for CountingMailer {
    fn send<'a>(&'a self, _receipt: &'a Receipt) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.sent.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// Connections open now, and the most open at once.
#[derive(Debug, Default)]
struct Gauge {
    open: AtomicUsize,
    most: AtomicUsize,
}

impl Gauge {
    fn opened(&self) {
        let now = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// A receiver that accepts every connection and never answers (a black hole), each connection
/// counted in `gauges` while it is open; its URL.
async fn black_hole(gauges: Vec<Arc<Gauge>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            let gauges = gauges.clone();
            gauges.iter().for_each(|g| g.opened());
            tokio::spawn(async move {
                // Read (and ignore) until the sender gives up and closes.
                let mut buffer = [0; 4096];
                while matches!(connection.read(&mut buffer).await, Ok(n) if n > 0) {}
                gauges.iter().for_each(|g| g.closed());
            });
        }
    });
    url
}

/// A receiver that answers every request 200 and closes; counts the requests; its URL.
async fn answering(requests: Arc<AtomicUsize>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            let requests = requests.clone();
            tokio::spawn(async move {
                let _ = connection.read(&mut [0; 8192]).await;
                requests.fetch_add(1, Ordering::SeqCst);
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let _ = connection.write_all(answer).await;
            });
        }
    });
    url
}

/// A URL where nothing listens: every delivery is refused at once.
async fn refusing() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    drop(listener);
    url
}

struct Harness {
    pool: PgPool,
    settings: Settings,
    mailer: Arc<CountingMailer>,
}

/// The sealing key of the settings, as the endpoints' secrets are sealed with it.
const SEALING_KEY: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

/// Settings with loopback allowed, short timeouts and passes, and `overrides`.
async fn harness(pool: PgPool, overrides: &[(&str, &str)]) -> Harness {
    let mut env = vec![
        ("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true"),
        ("PAYMENTS__WEBHOOKS__TIMEOUT_MS", "2000"),
        ("PAYMENTS__WORKER__INTERVAL_MS", "50"),
        ("PAYMENTS__WEBHOOKS__SEALING_KEY", SEALING_KEY),
    ];
    env.extend_from_slice(overrides);
    let settings =
        Settings::load_from(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))).unwrap();
    Harness { pool, settings, mailer: Arc::default() }
}

impl Harness {
    fn worker(&self) -> Worker<ProcessorClient> {
        let processor = ProcessorClient::new(self.settings.processor.client_config()).unwrap();
        Worker::new(
            self.pool.clone(),
            Arc::new(processor),
            "http://test".into(),
            &self.settings,
            self.mailer.clone(),
        )
        .unwrap()
    }

    /// A worker running its loops until the returned sender says stop.
    fn running(&self) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop_tx, stop) = watch::channel(false);
        let worker = self.worker();
        (stop_tx, tokio::spawn(async move { worker.run_until(stop).await }))
    }

    async fn pass(&self) {
        let (_stop_tx, stop) = watch::channel(false);
        self.worker().run_once(&stop).await.unwrap();
    }

    async fn account(&self, name: &str) -> AccountId {
        payments_domain::accounts::create_account(&self.pool, name).await.unwrap().0.id
    }

    async fn endpoint(&self, account: &AccountId, url: &str) -> WebhookEndpointId {
        let mut conn = self.pool.acquire().await.unwrap();
        let url = reqwest::Url::parse(url).unwrap();
        let keys = SealingKeys::new([0x5e; 32], []);
        webhooks::create(&mut conn, &keys, account, &url, &EnabledEvents::All).await.unwrap().id
    }

    /// `n` events of the account, each staging a delivery to every endpoint it has.
    async fn events(&self, account: &AccountId, n: usize) {
        let mut conn = self.pool.acquire().await.unwrap();
        for k in 0..n {
            let object = format!(r#"{{"id": "pay_{k}", "object": "payment"}}"#);
            events::record(&mut conn, account, EventType::PaymentSucceeded, object.as_bytes())
                .await
                .unwrap();
        }
    }

    /// Makes every delivery waiting for its retry due now (the database's clock, not a sleep).
    async fn make_due(&self) {
        sqlx::query("UPDATE jobs SET run_at = now() WHERE done_at IS NULL AND dead_at IS NULL AND claimed_until IS NULL")
            .execute(&self.pool)
            .await
            .unwrap();
    }

    async fn attempts(&self, endpoint: &WebhookEndpointId) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM webhook_attempts WHERE endpoint_id = $1")
            .bind(endpoint.as_str())
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn deliveries_run_at_once_up_to_the_caps_per_endpoint_and_per_account_across_workers(
    pool: PgPool,
) {
    let h = harness(
        pool,
        &[
            ("PAYMENTS__WEBHOOKS__MAX_DELIVERIES_PER_ENDPOINT", "2"),
            ("PAYMENTS__WEBHOOKS__MAX_DELIVERIES_PER_ACCOUNT", "3"),
            ("PAYMENTS__WEBHOOKS__TIMEOUT_MS", "1500"),
            ("PAYMENTS__WEBHOOKS__BACKOFF_BASE_MS", "100"),
            ("PAYMENTS__WEBHOOKS__BACKOFF_CAP_MS", "200"),
        ],
    )
    .await;
    // Account A: three silent endpoints, more deliveries than its cap. Account B: one silent
    // endpoint, more deliveries than the endpoint's cap.
    let (a, b) = (h.account("a").await, h.account("b").await);
    let a_total = Arc::new(Gauge::default());
    for _ in 0..3 {
        let url = black_hole(vec![a_total.clone(), Arc::new(Gauge::default())]).await;
        h.endpoint(&a, &url).await;
    }
    let b_endpoint = Arc::new(Gauge::default());
    let url = black_hole(vec![b_endpoint.clone()]).await;
    h.endpoint(&b, &url).await;
    h.events(&a, 4).await;
    h.events(&b, 4).await;

    // Two workers, each free to run 32 at once: the caps are held by both together.
    let (stop_one, one) = h.running();
    let (stop_two, two) = h.running();
    eventually("the caps reached", WAIT, || async {
        a_total.most() >= 3 && b_endpoint.most() >= 2
    })
    .await;
    // Through more than one round of timeouts and retries.
    let attempts = || async {
        let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_attempts")
            .fetch_one(&h.pool)
            .await
            .unwrap();
        attempts >= 12
    };
    eventually("the places used again as deliveries failed", WAIT, attempts).await;
    stop_one.send(true).unwrap();
    stop_two.send(true).unwrap();
    one.await.unwrap();
    two.await.unwrap();
    assert_eq!(a_total.most(), 3, "account A's deliveries at once");
    assert_eq!(b_endpoint.most(), 2, "deliveries to B's endpoint at once");
}

#[sqlx::test(migrations = "../../migrations")]
async fn due_deliveries_are_taken_round_robin_across_accounts_oldest_waiting_first(pool: PgPool) {
    let h = harness(pool, &[]).await;
    let (a, b, c) = (h.account("a").await, h.account("b").await, h.account("c").await);
    let url = refusing().await;
    for account in [&a, &b, &c] {
        h.endpoint(account, &url).await;
    }
    // A's deliveries fell due first, then B's, then C's.
    h.events(&a, 6).await;
    h.events(&b, 3).await;
    h.events(&c, 1).await;
    sqlx::query("UPDATE jobs SET run_at = now() - interval '1 hour' + make_interval(secs => id)")
        .execute(&h.pool)
        .await
        .unwrap();
    let caps = Caps { per_endpoint: 10, per_account: 10 };
    let claim = Duration::from_secs(300);
    let ids: Vec<i64> =
        deliveries::claim(&h.pool, 5, caps, claim).await.unwrap().iter().map(|j| j.id).collect();
    let mut taken: Vec<String> = sqlx::query_scalar(
        "SELECT w.account_id FROM jobs j JOIN webhook_endpoints w ON w.id = j.endpoint_id
          WHERE j.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&h.pool)
    .await
    .unwrap();
    taken.sort();
    // Each account's oldest, then each one's second (C has no second): not A's five oldest.
    let mut expected = vec![a.to_string(), a.to_string(), b.to_string(), b.to_string()];
    expected.push(c.to_string());
    expected.sort();
    assert_eq!(taken, expected);
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_endpoint_that_keeps_failing_is_paused_probed_and_resumed_after_a_success(pool: PgPool) {
    let mut h = harness(
        pool,
        &[
            // One at a time, so that the pause comes after exactly three.
            ("PAYMENTS__WEBHOOKS__MAX_DELIVERIES_PER_ENDPOINT", "1"),
            ("PAYMENTS__WEBHOOKS__PAUSE_AFTER_FAILURES", "3"),
            ("PAYMENTS__WEBHOOKS__PAUSE_AFTER_MINUTES", "0"),
            ("PAYMENTS__WEBHOOKS__PAUSE_MS", "60000"),
        ],
    )
    .await;
    let account = h.account("a").await;
    let endpoint = h.endpoint(&account, &refusing().await).await;
    h.events(&account, 6).await;
    // Three failures in a row: paused, and the three other deliveries are not tried.
    h.pass().await;
    assert_eq!(h.attempts(&endpoint).await, 3, "paused after the third failure");
    let paused_for: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM paused_until - now())::float8 FROM webhook_endpoints",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!((50.0..=60.0).contains(&paused_for), "paused for about a minute: {paused_for}");
    // Paused: due deliveries are deferred, not attempted.
    h.make_due().await;
    h.pass().await;
    assert_eq!(h.attempts(&endpoint).await, 3, "nothing tried while paused");
    // The pause ends: one delivery is tried (the probe), however many the endpoint may take at
    // once, fails, and the pause doubles.
    h.settings.webhooks.max_deliveries_per_endpoint = 3;
    sqlx::query("UPDATE webhook_endpoints SET paused_until = now()")
        .execute(&h.pool)
        .await
        .unwrap();
    h.pass().await;
    assert_eq!(h.attempts(&endpoint).await, 4, "one probe");
    let paused_for: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM paused_until - now())::float8 FROM webhook_endpoints",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!((110.0..=120.0).contains(&paused_for), "paused twice as long: {paused_for}");
    // The receiver is back: the next probe succeeds, the pause ends, and the rest go out.
    let requests = Arc::new(AtomicUsize::new(0));
    let url = answering(requests.clone()).await;
    sqlx::query("UPDATE webhook_endpoints SET url = $1, paused_until = now()")
        .bind(&url)
        .execute(&h.pool)
        .await
        .unwrap();
    h.make_due().await;
    h.pass().await;
    assert_eq!(requests.load(Ordering::SeqCst), 6, "every delivery made once it answered");
    let health: (i32, bool) = sqlx::query_as(
        "SELECT consecutive_failures, paused_until IS NULL AND failing_since IS NULL
           FROM webhook_endpoints",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(health, (0, true), "healthy again");
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_endpoint_failing_for_days_is_disabled_with_an_event_and_can_be_enabled_again(
    pool: PgPool,
) {
    let h = harness(pool, &[("PAYMENTS__WEBHOOKS__DISABLE_AFTER_HOURS", "72")]).await;
    let account = h.account("a").await;
    let failing = h.endpoint(&account, &refusing().await).await;
    let requests = Arc::new(AtomicUsize::new(0));
    let watching = h.endpoint(&account, &answering(requests.clone()).await).await;
    h.events(&account, 3).await;
    h.pass().await;
    assert_eq!(requests.load(Ordering::SeqCst), 3);
    // Failing since three days and a minute: the next failure disables it.
    sqlx::query("UPDATE webhook_endpoints SET failing_since = now() - interval '72 hours 1 minute' WHERE id = $1")
        .bind(failing.as_str())
        .execute(&h.pool)
        .await
        .unwrap();
    h.make_due().await;
    h.pass().await;
    let status: String = sqlx::query_scalar("SELECT status FROM webhook_endpoints WHERE id = $1")
        .bind(failing.as_str())
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(status, "disabled");
    let disabled: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT id, object FROM events WHERE type = 'webhook_endpoint.disabled'")
            .fetch_all(&h.pool)
            .await
            .unwrap();
    assert_eq!(disabled.len(), 1, "one event");
    let (event_id, object) = &disabled[0];
    assert_eq!(object["id"], failing.as_str());
    assert_eq!(object["status"], "disabled");
    assert!(object.get("secret").is_none(), "the event never shows the secret: {object}");
    // The event went out like any other: to the account's endpoint that takes it.
    h.pass().await;
    assert_eq!(requests.load(Ordering::SeqCst), 4, "the other endpoint was told");
    let delivered: bool = sqlx::query_scalar(
        "SELECT done_at IS NOT NULL FROM jobs WHERE dedupe_key = $1 || ':' || $2",
    )
    .bind(event_id)
    .bind(watching.as_str())
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!(delivered);
    // Its other deliveries are dropped unsent: nothing is pending for it.
    h.make_due().await;
    let tried = h.attempts(&failing).await;
    h.pass().await;
    assert_eq!(h.attempts(&failing).await, tried, "a disabled endpoint gets no delivery");
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE endpoint_id = $1 AND done_at IS NULL AND dead_at IS NULL",
    )
    .bind(failing.as_str())
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(pending, 0);
    // The account enables it again (the update route's own function): its health starts afresh.
    let mut conn = h.pool.acquire().await.unwrap();
    let enabled = webhooks::set_status(&mut *conn, &account, &failing, EndpointStatus::Enabled)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(enabled.status, EndpointStatus::Enabled);
    let health: (i32, bool) = sqlx::query_as(
        "SELECT consecutive_failures, failing_since IS NULL FROM webhook_endpoints WHERE id = $1",
    )
    .bind(failing.as_str())
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(health, (0, true));
    h.events(&account, 1).await;
    h.pass().await;
    assert_eq!(h.attempts(&failing).await, tried + 1, "delivered to again once enabled");
    let status: String = sqlx::query_scalar("SELECT status FROM webhook_endpoints WHERE id = $1")
        .bind(failing.as_str())
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(status, "enabled", "one failure after enabling does not disable it again");
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_delivery_stuck_on_a_silent_receiver_delays_neither_receipts_nor_the_reaper(
    pool: PgPool,
) {
    let h = harness(pool, &[("PAYMENTS__WEBHOOKS__TIMEOUT_MS", "20000")]).await;
    let account = h.account("a").await;
    let silent = Arc::new(Gauge::default());
    h.endpoint(&account, &black_hole(vec![silent.clone()]).await).await;
    // The delivery is staged first: a queue shared in order would run it first.
    h.events(&account, 1).await;
    sqlx::query(
        "INSERT INTO payments (id, account_id, amount, currency, status, capture_method,
                               payment_method)
         VALUES ('pay_receipt', $1, 1000, 'usd', 'succeeded', 'automatic', 'pm_card_visa')",
    )
    .bind(account.as_str())
    .execute(&h.pool)
    .await
    .unwrap();
    sqlx::query(
        r#"INSERT INTO jobs (kind, dedupe_key, payload)
           VALUES ('receipt', 'pay_receipt', '{"payment_id": "pay_receipt", "email": "jo@example.com"}')"#,
    )
    .execute(&h.pool)
    .await
    .unwrap();

    // A receipt goes only to an address its account verified.
    payments_domain::accounts::verify_email(&h.pool, &account, "jo@example.com").await.unwrap();

    let (stop_tx, running) = h.running();
    eventually("the delivery in hand", WAIT, || async { silent.open.load(Ordering::SeqCst) == 1 })
        .await;
    let stuck_since = Instant::now();
    // A key that expires while the delivery hangs.
    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, idempotency_key, fingerprint, request_method,
                                       request_path, request_id, operation, request_params,
                                       recovery_point, response_status, response_body,
                                       completed_at, created_at)
         VALUES ($1, 'expired', decode(repeat('00', 32), 'hex'), 'POST', '/v1/payments', 'req',
                 'payments.create', '{}', 'finished', 201, '\\x7b7d',
                 now() - interval '25 hours', now() - interval '25 hours')",
    )
    .bind(account.as_str())
    .execute(&h.pool)
    .await
    .unwrap();
    let reaped = || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
            .fetch_one(&h.pool)
            .await
            .unwrap();
        left == 0
    };
    eventually("the expired key reaped", WAIT, reaped).await;
    eventually("the receipt sent", WAIT, || async { h.mailer.sent.load(Ordering::SeqCst) == 1 })
        .await;
    assert!(
        stuck_since.elapsed() < Duration::from_secs(10),
        "the receipt and the reaper waited for the stuck delivery: {:?}",
        stuck_since.elapsed()
    );
    assert_eq!(silent.open.load(Ordering::SeqCst), 1, "the delivery was still stuck");
    // Not stopped gracefully: that would wait for the stuck delivery to time out.
    running.abort();
    drop(stop_tx);
}
