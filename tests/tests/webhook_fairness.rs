//! One tenant cannot hold back another's webhooks (issue #39): an account whose sixteen endpoints
//! accept every delivery and never answer, and which creates payments as fast as its rate limit
//! lets it, holds at most its own places in the worker; another account's webhook still goes out
//! in seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use payments_tests::{spawn_with_sim, test_settings};
use payments_worker::Worker;
use payments_worker::jobs::LogMailer;
use provider::ProcessorClient;
use serde_json::json;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Notify, watch};

/// Connections a black hole holds now, and the most it held at once.
#[derive(Debug, Default)]
struct Held {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// A receiver that accepts every connection, reads what comes, and never answers; its base URL.
async fn black_hole(held: Arc<Held>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            let now = held.now.fetch_add(1, Ordering::SeqCst) + 1;
            held.most.fetch_max(now, Ordering::SeqCst);
            let held = held.clone();
            tokio::spawn(async move {
                let mut buffer = [0; 4096];
                while matches!(connection.read(&mut buffer).await, Ok(n) if n > 0) {}
                held.now.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    url
}

/// A receiver that answers 200 and tells `arrived` of the first request; its URL.
async fn answering(arrived: Arc<Notify>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let url = format!("http://{}/hooks", listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        while let Ok((mut connection, _)) = listener.accept().await {
            let _ = connection.read(&mut [0; 8192]).await;
            arrived.notify_one();
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            let _ = connection.write_all(answer).await;
        }
    });
    url
}

#[sqlx::test(migrations = "../migrations")]
async fn another_accounts_webhook_is_delivered_within_5_s_while_one_account_black_holes_16_endpoints_at_its_rate_limit(
    pool: PgPool,
) {
    let loopback = ("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true");
    let (app, sim) = spawn_with_sim(
        pool.clone(),
        &[
            loopback,
            // A limit this machine sustains beside the worker: 20 payments a second, each fanning
            // out to 16 silent endpoints.
            ("PAYMENTS__RATE_LIMIT__PER_SECOND", "20"),
            ("PAYMENTS__RATE_LIMIT__BURST", "20"),
        ],
    )
    .await;
    let (_, noisy) = app.create_account("noisy").await;
    let (_, quiet) = app.create_account("quiet").await;
    let held = Arc::new(Held::default());
    let hole = black_hole(held.clone()).await;
    for n in 0..16 {
        let body = json!({"url": format!("{hole}/hooks/{n}"), "enabled_events": ["*"]});
        let created = app.post("/v1/webhook_endpoints", &noisy, None, &body).await;
        assert_eq!(created.status(), 201);
    }
    let arrived = Arc::new(Notify::new());
    let body = json!({"url": answering(arrived.clone()).await, "enabled_events": ["*"]});
    let created = app.post("/v1/webhook_endpoints", &quiet, None, &body).await;
    assert_eq!(created.status(), 201);

    // The worker as deployed (a delivery may take 10 s), but for the loopback endpoints.
    let settings = test_settings(&[("PAYMENTS__PROCESSOR__BASE_URL", &sim), loopback]);
    let processor = ProcessorClient::new(settings.processor.client_config()).expect("a client");
    let mailer = Arc::new(LogMailer);
    let worker =
        Worker::new(pool.clone(), Arc::new(processor), "http://test".into(), &settings, mailer)
            .expect("a worker");
    let (_stop_tx, stop) = watch::channel(false);
    let running = tokio::spawn(async move { worker.run_until(stop).await });

    // The noisy account creates payments at its limit, for as long as the test runs.
    let made = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (http, url, made) = (app.http.clone(), app.url("/v1/payments"), made.clone());
        tokio::spawn(async move {
            for n in 0.. {
                let answer = http
                    .post(&url)
                    .bearer_auth(&noisy)
                    .header("idempotency-key", format!("flood-{n}"))
                    .json(&json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}))
                    .send()
                    .await;
                if answer.is_ok_and(|a| a.status() == 201) {
                    made.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    // A backlog: the worker is inside silent deliveries, and hundreds more wait behind them.
    let backlog =
        || async { held.now.load(Ordering::SeqCst) > 0 && made.load(Ordering::SeqCst) >= 40 };
    payments_testkit::eventually("the noisy account's backlog", Duration::from_secs(30), backlog)
        .await;

    let paid = app
        .post(
            "/v1/payments",
            &quiet,
            Some("quiet-1"),
            &json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"}),
        )
        .await;
    assert_eq!(paid.status(), 201);
    let since = Instant::now();
    let delivered = tokio::time::timeout(Duration::from_secs(5), arrived.notified()).await;
    let waited = since.elapsed();
    flood.abort();
    let backlog: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs WHERE kind = 'webhook' AND done_at IS NULL AND dead_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .expect("the backlog");
    assert!(delivered.is_ok(), "the quiet account's webhook waited {waited:?} behind {backlog}");
    assert!(backlog >= 16 * 40, "the noisy account's deliveries were still waiting: {backlog}");
    assert!(
        held.most.load(Ordering::SeqCst) <= 8,
        "the noisy account held more places than its cap: {}",
        held.most.load(Ordering::SeqCst)
    );
    // Not stopped gracefully: that would wait for the silent deliveries in hand to time out.
    running.abort();
}
