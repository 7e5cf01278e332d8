//! Events and webhooks, end to end: every committed change has exactly one event, written with
//! it; every event reaches every matching endpoint at least once, signed, through a receiver
//! that answers 500s and hangs before it recovers, a runner that dies mid-delivery, and forced
//! redeliveries; and the example receiver (`crates/client/examples/webhook_receiver.rs`, included
//! here as a module) applies each event exactly once.

#[path = "../../crates/client/examples/webhook_receiver.rs"]
#[allow(dead_code)]
mod receiver;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use payments_domain::jobs::Work;
use payments_tests::{SEALING_KEY, TestApp, assert_problem, json, spawn_with_sim, test_settings};
use payments_worker::Worker;
use payments_worker::jobs::LogMailer;
use provider::ProcessorClient;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;

/// What the receiver does before it recovers: answer 500 to the first `fail` requests, then
/// hang (never answer) on the next `hang`, then apply the next `hang_after` and hang before
/// answering (a lost acknowledgement), then pass requests to the example receiver.
#[derive(Debug, Default)]
struct Faults {
    fail: AtomicUsize,
    hang: AtomicUsize,
    hang_after: AtomicUsize,
    seen: AtomicUsize,
}

/// Starts the example receiver behind the faults; returns its URL.
async fn start_receiver(pool: PgPool, secret: String, faults: Arc<Faults>) -> String {
    receiver::migrate(&pool).await.expect("the receiver's tables");
    let state = receiver::Receiver {
        pool,
        secret,
        tolerance: payments_client::webhooks::DEFAULT_TOLERANCE,
    };
    let app = receiver::router(state).layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let faults = faults.clone();
            async move {
                faults.seen.fetch_add(1, Ordering::SeqCst);
                let take = |n: &AtomicUsize| {
                    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1)).is_ok()
                };
                if take(&faults.fail) {
                    return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
                }
                if take(&faults.hang) {
                    std::future::pending::<()>().await;
                }
                let response: Response = next.run(request).await;
                if take(&faults.hang_after) {
                    std::future::pending::<()>().await;
                }
                response
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://127.0.0.1:{port}/webhooks")
}

/// A worker over the test database with the given settings overrides (loopback allowed).
pub(crate) fn worker(
    pool: &PgPool,
    sim: &str,
    overrides: &[(&str, &str)],
) -> Worker<ProcessorClient> {
    let mut all = vec![
        ("PAYMENTS__PROCESSOR__BASE_URL", sim),
        ("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true"),
        ("PAYMENTS__WEBHOOKS__TIMEOUT_MS", "1000"),
    ];
    all.extend_from_slice(overrides);
    let settings = test_settings(&all);
    let processor = ProcessorClient::new(settings.processor.client_config()).expect("a client");
    Worker::new(
        pool.clone(),
        Arc::new(processor),
        "http://test".into(),
        &settings,
        Arc::new(LogMailer),
    )
    .expect("a worker")
}

pub(crate) async fn pass(worker: &Worker<ProcessorClient>) {
    let (_stop_tx, stop) = watch::channel(false);
    worker.run_once(&stop).await.expect("a worker pass");
}

/// Makes every delivery waiting for its retry due now, as if its back-off had run out: the
/// database's clock, not a sleep. A delivery being run (claimed) is left to its runner.
async fn make_deliveries_due(pool: &PgPool) {
    sqlx::query("UPDATE jobs SET run_at = now() WHERE kind = 'webhook' AND done_at IS NULL AND dead_at IS NULL AND claimed_until IS NULL")
        .execute(pool)
        .await
        .expect("jobs made due");
}

/// Ends every claim on a delivery, as if the runner that holds it had died and its claim run out
/// (the claim's end makes the job due, and frees its place under the caps): the database's
/// clock, not a sleep.
async fn expire_delivery_claims(pool: &PgPool) {
    sqlx::query("UPDATE jobs SET run_at = now(), claimed_until = NULL WHERE kind = 'webhook' AND done_at IS NULL AND dead_at IS NULL AND claimed_until IS NOT NULL")
        .execute(pool)
        .await
        .expect("claims ended");
}

async fn create_payment(app: &TestApp, key: &str, idem: &str, body: Value) -> Value {
    let response = app.post("/v1/payments", key, Some(idem), &body).await;
    json(response).await
}

/// The account's events (`GET /v1/events`), once every committed one is listed.
async fn events(app: &TestApp, key: &str, query: &str) -> Vec<Value> {
    wait_for_the_feed_to_settle(&app.pool).await;
    let list = json(app.get(&format!("/v1/events?limit=100{query}"), key).await).await;
    list["data"].as_array().cloned().expect("a list")
}

/// Waits until no transaction that was running when a committed event was written is running
/// still: the list shows an event only then (docs/webhooks.md, "The feed's order"), and a write
/// transaction of another test on the same cluster may be one of them (bounded at a minute).
async fn wait_for_the_feed_to_settle(pool: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let unlisted = payments_domain::events::unlisted(pool).await.expect("the feed's horizon");
        let settled = unlisted == 0;
        if settled {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "a write transaction held the feed back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn every_committed_change_has_exactly_one_event_of_its_type(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("acme").await;
    let paid = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    let succeeded = create_payment(&app, &key, "k1", paid.clone()).await;
    // A replay of the same key changes nothing, so it writes no event.
    let replayed = create_payment(&app, &key, "k1", paid).await;
    assert_eq!(replayed["id"], succeeded["id"]);
    let manual = json!({"amount": 700, "currency": "usd", "payment_method": "pm_card_visa", "capture_method": "manual"});
    let authorized = create_payment(&app, &key, "k2", manual).await;
    let id = authorized["id"].as_str().expect("an id");
    app.post(&format!("/v1/payments/{id}/capture"), &key, Some("k3"), &json!({})).await;
    app.post(&format!("/v1/payments/{id}/refunds"), &key, Some("k4"), &json!({"amount": 100}))
        .await;
    let declined =
        json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined"});
    create_payment(&app, &key, "k5", declined).await;

    let all = events(&app, &key, "").await;
    let types: Vec<&str> = all.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        [
            "payment.failed",
            "refund.succeeded",
            "payment.captured",
            "payment.requires_capture",
            "payment.succeeded"
        ],
        "newest first, one per change"
    );
    assert_eq!(all[4]["data"]["object"], succeeded, "the object as the API showed it");
    assert_eq!(all[2]["data"]["object"]["status"], "succeeded");
    assert_eq!(all[2]["data"]["object"]["amount_captured"], 700);

    let captured = events(&app, &key, "&type=payment.captured").await;
    assert_eq!(captured.len(), 1);
    assert_eq!(captured[0]["id"], all[2]["id"]);
    let page = json(
        app.get(
            &format!("/v1/events?limit=2&starting_after={}", all[1]["id"].as_str().expect("id")),
            &key,
        )
        .await,
    )
    .await;
    assert_eq!(page["data"][0]["id"], all[2]["id"]);
    assert_eq!(page["has_more"], true);

    let one = app.get(&format!("/v1/events/{}", all[0]["id"].as_str().expect("id")), &key).await;
    assert_eq!(json(one).await, all[0]);
    // Another account sees none of it.
    let (_, other) = app.create_account("other").await;
    assert!(events(&app, &other, "").await.is_empty());
    let hidden =
        app.get(&format!("/v1/events/{}", all[0]["id"].as_str().expect("id")), &other).await;
    assert_problem(hidden, 404, "resource_missing").await;
    let bad_type = app.get("/v1/events?type=payment.nope", &key).await;
    assert_problem(bad_type, 400, "invalid_request").await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_change_that_rolls_back_leaves_no_event_and_no_delivery(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (account, key) = app.create_account("acme").await;
    let endpoint = app
        .post(
            "/v1/webhook_endpoints",
            &key,
            None,
            &json!({"url": "https://hooks.example.com/x", "enabled_events": ["*"]}),
        )
        .await;
    assert_eq!(endpoint.status(), 201);
    let mut tx = pool.begin().await.expect("a transaction");
    let object = br#"{"id":"pay_x","object":"payment"}"#;
    payments_domain::events::record(
        &mut tx,
        &account.parse().expect("an account id"),
        payments_domain::events::EventType::PaymentSucceeded,
        object,
    )
    .await
    .expect("recorded");
    let staged: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE kind = 'webhook'")
        .fetch_one(&mut *tx)
        .await
        .expect("count");
    assert_eq!(staged, 1, "the fan-out is staged in the same transaction");
    tx.rollback().await.expect("rolled back");
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM jobs WHERE kind = 'webhook')",
    )
    .fetch_one(&pool)
    .await
    .expect("counts");
    assert_eq!(left, (0, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn endpoint_urls_are_held_to_the_address_rule(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (_, key) = app.create_account("acme").await;
    for url in [
        "http://127.0.0.1:4242/hook",
        "http://localhost/hook",
        "http://10.0.0.8/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "ftp://hooks.example.com/",
        "not a url",
    ] {
        let response = app
            .post(
                "/v1/webhook_endpoints",
                &key,
                None,
                &json!({"url": url, "enabled_events": ["*"]}),
            )
            .await;
        let problem = assert_problem(response, 400, "invalid_request").await;
        assert_eq!(problem["param"], "url", "{url}");
    }
    let unknown = app
        .post(
            "/v1/webhook_endpoints",
            &key,
            None,
            &json!({"url": "https://hooks.example.com/", "enabled_events": ["payment.nope"]}),
        )
        .await;
    assert_problem(unknown, 400, "invalid_request").await;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_endpoints")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(count, 0, "nothing recorded for a refused URL");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_keyed_endpoint_update_is_replayed_not_applied_again(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("acme").await;
    let body = json!({"url": "https://hooks.example.com/a", "enabled_events": ["*"]});
    let created = json(app.post("/v1/webhook_endpoints", &key, None, &body).await).await;
    let id = created["id"].as_str().expect("id").to_owned();
    let path = format!("/v1/webhook_endpoints/{id}");
    let disable = json!({"disabled": true});

    // An unknown endpoint stores nothing for the key: the same key then serves another path.
    let last = if id.ends_with('a') { 'b' } else { 'a' };
    let unknown = format!("/v1/webhook_endpoints/{}{last}", &id[..id.len() - 1]);
    let refused = app.post(&unknown, &key, Some("off-1"), &disable).await;
    assert_problem(refused, 404, "resource_missing").await;

    let first = app.post(&path, &key, Some("off-1"), &disable).await;
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first = first.bytes().await.expect("a body");
    let answered: Value = serde_json::from_slice(&first).expect("JSON");
    assert_eq!(answered["status"], "disabled");
    assert!(answered.get("secret").is_none_or(Value::is_null), "no secret: {answered}");

    // Someone enables it again; then the first request's retry arrives (its answer was lost).
    let enabled = app.post(&path, &key, None, &json!({"disabled": false})).await;
    assert_eq!(json(enabled).await["status"], "enabled");
    let retry = app.post(&path, &key, Some("off-1"), &disable).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.bytes().await.expect("a body"), first, "the first answer, byte for byte");
    let now = json(app.get(&path, &key).await).await;
    assert_eq!(now["status"], "enabled", "the retry did not disable the endpoint again");

    let other = app.post(&path, &key, Some("off-1"), &json!({"disabled": false})).await;
    assert_problem(other, 422, "idempotency_key_reused").await;

    // Once the endpoint is deleted, the retry still gets its answer; a new key gets the 404, kept
    // (a deletion is for good).
    assert_eq!(app.delete(&path, &key).await.status(), 200);
    let retry = app.post(&path, &key, Some("off-1"), &disable).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.bytes().await.expect("a body"), first);
    assert_problem(app.post(&path, &key, Some("off-2"), &disable).await, 404, "resource_missing")
        .await;
    let again = app.post(&path, &key, Some("off-2"), &disable).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_problem(again, 404, "resource_missing").await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_keyed_endpoint_creation_is_replayed_byte_for_byte_secret_included(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (_, key) = app.create_account("acme").await;
    let body = json!({"url": "https://hooks.example.com/a", "enabled_events": ["*"]});
    let create = |idem: Option<&'static str>, body: Value| {
        let (app, key) = (&app, key.clone());
        async move { app.post("/v1/webhook_endpoints", &key, idem, &body).await }
    };
    let endpoints = || async {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_endpoints")
            .fetch_one(&pool)
            .await
            .expect("count");
        count
    };

    // A refusal before the claim stores nothing for the key.
    let refused = create(Some("we-1"), json!({"url": "http://10.0.0.8/", "enabled_events": ["*"]}));
    assert_problem(refused.await, 400, "invalid_request").await;

    let first = create(Some("we-1"), body.clone()).await;
    assert_eq!(first.status(), 201);
    let location = first.headers()["location"].clone();
    let first = first.bytes().await.expect("a body");
    let created: Value = serde_json::from_slice(&first).expect("JSON");
    assert!(created["secret"].as_str().is_some_and(|s| s.starts_with("whsec_")), "{created}");

    let again = create(Some("we-1"), body.clone()).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], location);
    assert_eq!(again.bytes().await.expect("a body"), first, "the same answer, secret included");
    assert_eq!(endpoints().await, 1, "one endpoint for the key");

    let other = create(
        Some("we-1"),
        json!({"url": "https://hooks.example.com/b", "enabled_events": ["*"]}),
    );
    assert_problem(other.await, 422, "idempotency_key_reused").await;

    // Without a key, each request registers one, as before.
    assert_eq!(create(None, body.clone()).await.status(), 201);
    assert_eq!(create(None, body).await.status(), 201);
    assert_eq!(endpoints().await, 3);
}

#[sqlx::test(migrations = "../migrations")]
async fn every_event_reaches_the_receiver_through_failures_and_is_applied_exactly_once(
    pool: PgPool,
) {
    let (app, sim) =
        spawn_with_sim(pool.clone(), &[("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true")]).await;
    let (_, key) = app.create_account("acme").await;
    // The secret is known only once the endpoint exists, and the URL only once the receiver
    // listens: register first with a placeholder route, then start the receiver on that secret.
    let faults = Arc::new(Faults::default());
    faults.fail.store(3, Ordering::SeqCst);
    faults.hang.store(1, Ordering::SeqCst);
    let placeholder = app
        .post(
            "/v1/webhook_endpoints",
            &key,
            None,
            &json!({"url": "http://127.0.0.1:9/webhooks", "enabled_events": ["*"]}),
        )
        .await;
    let placeholder = json(placeholder).await;
    let secret = placeholder["secret"].as_str().expect("the secret, shown once").to_owned();
    assert!(secret.starts_with("whsec_"));
    let url = start_receiver(pool.clone(), secret, faults.clone()).await;
    sqlx::query("UPDATE webhook_endpoints SET url = $1")
        .bind(&url)
        .execute(&pool)
        .await
        .expect("url");
    let endpoint_id = placeholder["id"].as_str().expect("id").to_owned();
    let shown = json(app.get(&format!("/v1/webhook_endpoints/{endpoint_id}"), &key).await).await;
    assert!(shown.get("secret").is_none(), "the secret is shown once: {shown}");

    // A second endpoint that asks only for refunds gets none of these payment events.
    let refunds_only = app
        .post(
            "/v1/webhook_endpoints",
            &key,
            None,
            &json!({"url": url, "enabled_events": ["refund.succeeded"]}),
        )
        .await;
    assert_eq!(refunds_only.status(), 201);

    for n in 0..4 {
        let body = json!({"amount": 100 + n, "currency": "usd", "payment_method": "pm_card_visa"});
        create_payment(&app, &key, &format!("pay-{n}"), body).await;
    }
    let all = events(&app, &key, "").await;
    assert_eq!(all.len(), 4);

    let worker = worker(&pool, &sim, &[]);
    // Three 500s, one hang past the timeout, then recovery: each failure is logged and retried.
    for _ in 0..8 {
        pass(&worker).await;
        make_deliveries_due(&pool).await;
    }
    let applied: Vec<(String,)> =
        sqlx::query_as("SELECT event_id FROM receiver_processed_events ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .expect("applied");
    let mut expected: Vec<String> =
        all.iter().filter_map(|e| e["id"].as_str().map(str::to_owned)).collect();
    expected.sort();
    assert_eq!(applied.into_iter().map(|(id,)| id).collect::<Vec<_>>(), expected);

    let log =
        json(app.get(&format!("/v1/webhook_endpoints/{endpoint_id}/attempts"), &key).await).await;
    let outcomes: Vec<&str> = log["data"]
        .as_array()
        .expect("a log")
        .iter()
        .filter_map(|a| a["outcome"].as_str())
        .collect();
    assert_eq!(outcomes.iter().filter(|o| **o == "retrying").count(), 4, "{log}");
    assert_eq!(outcomes.iter().filter(|o| **o == "delivered").count(), 4, "{log}");
    assert!(
        log["data"]
            .as_array()
            .expect("a log")
            .iter()
            .any(|a| a["status_code"].is_null() && a["error"] == "timeout"),
        "the hang is logged as an attempt without an answer: {log}"
    );
    assert!(
        log["data"]
            .as_array()
            .expect("a log")
            .iter()
            .any(|a| a["status_code"] == 500 && a["error"] == "http_status"),
        "a 500 is logged as the receiver's status: {log}"
    );

    // Forced redeliveries (as after a lost acknowledgement): the receiver sees every event
    // again and changes nothing.
    sqlx::query("UPDATE jobs SET done_at = NULL, run_at = now() WHERE kind = 'webhook'")
        .execute(&pool)
        .await
        .expect("redelivery");
    let seen_before = faults.seen.load(Ordering::SeqCst);
    pass(&worker).await;
    assert_eq!(faults.seen.load(Ordering::SeqCst), seen_before + 4, "each event delivered again");
    let counts: Vec<(i32,)> = sqlx::query_as("SELECT events_applied FROM receiver_objects")
        .fetch_all(&pool)
        .await
        .expect("effects");
    assert_eq!(counts.len(), 4);
    assert!(counts.iter().all(|(n,)| *n == 1), "each event applied exactly once: {counts:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_delivery_abandoned_mid_flight_is_delivered_by_the_next_runner(pool: PgPool) {
    let (app, sim) =
        spawn_with_sim(pool.clone(), &[("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true")]).await;
    let (_, key) = app.create_account("acme").await;
    let created = app
        .post(
            "/v1/webhook_endpoints",
            &key,
            None,
            &json!({"url": "http://127.0.0.1:9/webhooks", "enabled_events": ["payment.succeeded"]}),
        )
        .await;
    let created = json(created).await;
    let faults = Arc::new(Faults::default());
    let url = start_receiver(
        pool.clone(),
        created["secret"].as_str().expect("secret").into(),
        faults.clone(),
    )
    .await;
    sqlx::query("UPDATE webhook_endpoints SET url = $1")
        .bind(&url)
        .execute(&pool)
        .await
        .expect("url");
    create_payment(
        &app,
        &key,
        "p1",
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}),
    )
    .await;

    // A runner claims the delivery and dies before it posts or records anything (the claim is
    // taken and never finished, as after SIGKILL).
    let caps = payments_domain::deliveries::Caps { per_endpoint: 2, per_account: 8 };
    let claim = Duration::from_secs(300);
    let claimed = payments_domain::deliveries::claim(&pool, 1, caps, claim).await.expect("a claim");
    assert_eq!(claimed.len(), 1);
    assert!(matches!(claimed[0].work, Ok(Work::Webhook(_))), "{claimed:?}");
    let worker = worker(&pool, &sim, &[]);
    pass(&worker).await;
    assert_eq!(faults.seen.load(Ordering::SeqCst), 0, "the claim hides the job until it runs out");
    expire_delivery_claims(&pool).await;
    pass(&worker).await;
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM receiver_processed_events")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(applied, 1);
    let attempt: i32 = sqlx::query_scalar("SELECT attempt FROM webhook_attempts")
        .fetch_one(&pool)
        .await
        .expect("one logged attempt");
    assert_eq!(attempt, 2, "the second claim delivered");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_disabled_or_deleted_endpoint_receives_nothing_and_a_failing_one_is_dead_lettered_at_the_horizon(
    pool: PgPool,
) {
    const TOKEN: &str = "inspector-token-for-webhooks";
    let (app, sim) = spawn_with_sim(
        pool.clone(),
        &[
            ("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true"),
            ("PAYMENTS__INSPECTOR__ENABLED", "true"),
            ("PAYMENTS__INSPECTOR__TOKEN", TOKEN),
        ],
    )
    .await;
    let (_, key) = app.create_account("acme").await;
    let faults = Arc::new(Faults::default());
    faults.fail.store(usize::MAX, Ordering::SeqCst);
    let url = start_receiver(pool.clone(), "whsec_unused".into(), faults.clone()).await;
    let body = json!({"url": url, "enabled_events": ["*"]});
    let disabled = json(app.post("/v1/webhook_endpoints", &key, None, &body).await).await;
    let disabled_id = disabled["id"].as_str().expect("id");
    let update = app
        .post(
            &format!("/v1/webhook_endpoints/{disabled_id}"),
            &key,
            None,
            &json!({"disabled": true}),
        )
        .await;
    assert_eq!(json(update).await["status"], "disabled");
    // Its Idempotency-Key is checked as on every POST.
    let path = format!("/v1/webhook_endpoints/{disabled_id}");
    let malformed = app.post(&path, &key, Some("\"unclosed"), &json!({"disabled": true})).await;
    assert_problem(malformed, 400, "idempotency_key_invalid").await;
    let keyed = app.post(&path, &key, Some("disable-1"), &json!({"disabled": true})).await;
    assert_eq!(json(keyed).await["status"], "disabled");
    let deleted = json(app.post("/v1/webhook_endpoints", &key, None, &body).await).await;
    let deleted_id = deleted["id"].as_str().expect("id").to_owned();
    let failing = json(app.post("/v1/webhook_endpoints", &key, None, &body).await).await;
    let failing_id = failing["id"].as_str().expect("id").to_owned();

    create_payment(
        &app,
        &key,
        "p1",
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}),
    )
    .await;
    let removed = app.delete(&format!("/v1/webhook_endpoints/{deleted_id}"), &key).await;
    assert_eq!(removed.status(), 200);
    let listed = json(app.get("/v1/webhook_endpoints", &key).await).await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(2), "{listed}");

    // The event is three days and a minute old: the first failure is past the horizon.
    sqlx::query("UPDATE events SET created_at = now() - interval '72 hours 1 minute'")
        .execute(&pool)
        .await
        .expect("aged");
    let worker = worker(&pool, &sim, &[]);
    pass(&worker).await;
    assert_eq!(faults.seen.load(Ordering::SeqCst), 1, "only the enabled endpoint was called");
    let jobs: Vec<(String, bool, bool)> = sqlx::query_as(
        "SELECT payload->>'endpoint_id', done_at IS NOT NULL, dead_at IS NOT NULL FROM jobs
          WHERE kind = 'webhook' ORDER BY payload->>'endpoint_id'",
    )
    .fetch_all(&pool)
    .await
    .expect("jobs");
    // Only the endpoint enabled when the event was written got a job: the disabled one none.
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for (endpoint, done, dead) in jobs {
        if endpoint == failing_id {
            assert!(dead && !done, "dead-lettered");
        } else {
            assert_eq!(endpoint, deleted_id);
            assert!(done && !dead, "dropped without a delivery");
        }
    }
    let log =
        json(app.get(&format!("/v1/webhook_endpoints/{failing_id}/attempts"), &key).await).await;
    assert_eq!(log["data"][0]["outcome"], "dead", "{log}");
    assert_eq!(log["data"][0]["status_code"], 500, "{log}");
    // The operator sees the same delivery log in the inspector.
    let page = app.send(app.http.get(app.url("/inspector")).bearer_auth(TOKEN)).await;
    let page = page.text().await.unwrap();
    let section = &page[page.find("Webhook deliveries").expect("the section")..];
    assert!(section.contains(&failing_id) && section.contains(">dead<"), "{section}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_worker_sigkilled_mid_delivery_is_followed_by_one_that_delivers_and_the_receiver_applies_once(
    pool: PgPool,
) {
    use payments_tests::system::{Process, System, free_port, scale, seed};
    let sys = System::start(pool.clone()).await;
    let loopback = [("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true")];
    let api = sys.api_with("", &loopback).await;
    let account = sys.account("acme").await;
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{}/v1/webhook_endpoints", api.url))
        .bearer_auth(&account.secret)
        .json(&json!({"url": "http://127.0.0.1:9/webhooks", "enabled_events": ["*"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let faults = Arc::new(Faults::default());
    // Seeded: some 500s first; then the delivery the worker is killed in applies its event and
    // never answers, so the next runner's delivery of it is a duplicate at the receiver.
    faults.fail.store(usize::try_from(seed() % 3).unwrap_or(0) + 1, Ordering::SeqCst);
    faults.hang_after.store(1, Ordering::SeqCst);
    let url =
        start_receiver(pool.clone(), created["secret"].as_str().unwrap().into(), faults.clone())
            .await;
    sqlx::query("UPDATE webhook_endpoints SET url = $1").bind(&url).execute(&pool).await.unwrap();
    let payments = 3 * scale();
    for n in 0..payments {
        let answer = http
            .post(format!("{}/v1/payments", api.url))
            .bearer_auth(&account.secret)
            .header("idempotency-key", format!("kill-{n}"))
            .json(&json!({"amount": 100 + n, "currency": "usd", "payment_method": "pm_card_visa"}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 201);
    }
    let env = |timeout_ms: &str| {
        vec![
            ("DATABASE_URL", sys.db_url.clone()),
            ("PAYMENTS__PROCESSOR__BASE_URL", sys.sim.url.clone()),
            ("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true".to_owned()),
            ("PAYMENTS__WEBHOOKS__TIMEOUT_MS", timeout_ms.to_owned()),
            ("PAYMENTS__WORKER__METRICS_PORT", "0".to_owned()),
            ("PAYMENTS__LOG__FILTER", "warn".to_owned()),
            (SEALING_KEY.0, SEALING_KEY.1.to_owned()),
        ]
    };
    // A long-running worker with a long delivery timeout: it is inside the hanging delivery
    // when it is killed.
    let mut doomed = Process::start("payments-worker", &[], &env("60000"), free_port());
    let hung = 1 + faults.fail.load(Ordering::SeqCst);
    let mut waited = 0;
    while faults.seen.load(Ordering::SeqCst) < hung {
        // Each 500 is retried after back-off; make it due so the worker reaches the hang.
        make_deliveries_due(&pool).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
        assert!(waited < 1200, "the worker never reached the hanging delivery: {}", doomed.log());
    }
    doomed.kill9().await;
    // The dead worker's claims run out (the database's clock moved, not a sleep), and others
    // finish the work.
    expire_delivery_claims(&pool).await;
    make_deliveries_due(&pool).await;
    for _ in 0..3 {
        let mut once = Process::start("payments-worker", &["--once"], &env("5000"), free_port());
        let status = tokio::time::timeout(Duration::from_secs(60), once.wait()).await;
        assert!(matches!(status, Ok(Ok(s)) if s.success()), "{status:?}: {}", once.log());
        make_deliveries_due(&pool).await;
    }
    let (events, processed, delivered): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM events),
                (SELECT count(*) FROM receiver_processed_events),
                (SELECT count(*) FROM jobs WHERE kind = 'webhook' AND done_at IS NOT NULL)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(events, i64::try_from(payments).unwrap(), "one event per committed change");
    assert_eq!(processed, events, "every event reached the receiver");
    assert_eq!(delivered, events, "every delivery done");
    let counts: Vec<(i32,)> = sqlx::query_as("SELECT events_applied FROM receiver_objects")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(counts.iter().all(|(n,)| *n == 1), "each applied exactly once: {counts:?}");
    let delivered_events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT event_id FROM webhook_attempts WHERE outcome = 'delivered'
           GROUP BY event_id) d",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(delivered_events, events, "each event has a delivered attempt in the log");
    assert!(
        faults.seen.load(Ordering::SeqCst) > usize::try_from(events).unwrap() + 1,
        "the killed delivery was posted again"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn the_receiver_answers_bad_deliveries_400_and_records_nothing(pool: PgPool) {
    let secret = "whsec_receiver";
    let url = start_receiver(pool.clone(), secret.into(), Arc::new(Faults::default())).await;
    let http = reqwest::Client::new();
    let event = br#"{"id":"evt_1","type":"payment.succeeded","created":1,"data":{"object":{"id":"pay_1"}}}"#;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .cast_signed();
    let signed =
        |t: i64, body: &[u8], key: &str| payments_domain::webhooks::signature_header(key, t, body);
    let cases: Vec<(&str, Vec<u8>, Option<String>)> = vec![
        ("no signature", event.to_vec(), None),
        ("a bad signature", event.to_vec(), Some(signed(now, event, "whsec_other"))),
        ("a replayed timestamp", event.to_vec(), Some(signed(now - 3600, event, secret))),
        ("a garbled header", event.to_vec(), Some("v1=abc".into())),
        ("malformed JSON", b"{not json".to_vec(), Some(signed(now, b"{not json", secret))),
    ];
    for (case, body, header) in cases {
        let mut request = http.post(&url).body(body);
        if let Some(header) = header {
            request = request.header("Payments-Signature", header);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 400, "{case}");
        assert!(!response.text().await.unwrap().is_empty(), "{case}: a reason is given");
    }
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM receiver_processed_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(recorded, 0, "nothing recorded for a refused delivery");
    // The same event, well signed, is applied.
    let ok = http
        .post(&url)
        .header("Payments-Signature", signed(now, event, secret))
        .body(event.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_invariant_checker_catches_a_lost_a_doubled_and_an_invented_event(pool: PgPool) {
    use payments_tests::system::System;
    let sys = Arc::new(System::start(pool.clone()).await);
    let api = sys.api("").await;
    let account = sys.account("acme").await;
    let answer = sys
        .http
        .post(format!("{}/v1/payments", api.url))
        .bearer_auth(&account.secret)
        .header("idempotency-key", "k")
        .json(&json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    sys.check_invariants(false).await;
    let caught = |sys: Arc<System>| async move {
        let checked = tokio::spawn(async move { sys.check_invariants(false).await });
        let panic = checked.await.unwrap_err().into_panic();
        panic.downcast_ref::<String>().cloned().unwrap_or_default()
    };

    // Doubled: the same change written twice.
    sqlx::query(
        "INSERT INTO events (id, account_id, type, object)
         SELECT 'evt_copy', account_id, type, object FROM events",
    )
    .execute(&pool)
    .await
    .unwrap();
    let message = caught(sys.clone()).await;
    assert!(message.contains("(\"payment.succeeded\", 2)"), "{message}");
    // Lost: the change committed without its event.
    sqlx::query("DELETE FROM events").execute(&pool).await.unwrap();
    let message = caught(sys.clone()).await;
    assert!(message.contains("(payment:succeeded) has the events []"), "{message}");
    // Invented: an event for a change that never committed.
    sqlx::query(
        "INSERT INTO events (id, account_id, type, object)
         VALUES ('evt_ghost', $1, 'payment.succeeded', '{\"id\": \"pay_ghost\"}')",
    )
    .bind(&account.id)
    .execute(&pool)
    .await
    .unwrap();
    let message = caught(sys.clone()).await;
    assert!(message.contains("name pay_ghost, which does not exist"), "{message}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_delivery_job_that_names_no_event_is_dead_lettered_after_the_job_bound(pool: PgPool) {
    let (_app, sim) = spawn_with_sim(pool.clone(), &[]).await;
    sqlx::query(
        "INSERT INTO jobs (kind, dedupe_key, payload)
         VALUES ('webhook', 'evt_none:we_none', '{\"event_id\": \"evt_none\", \"endpoint_id\": \"we_none\"}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let worker = worker(&pool, &sim, &[("PAYMENTS__WORKER__JOB_MAX_ATTEMPTS", "2")]);
    for _ in 0..2 {
        pass(&worker).await;
        make_deliveries_due(&pool).await;
    }
    let (attempts, dead): (i32, bool) =
        sqlx::query_as("SELECT attempts, dead_at IS NOT NULL FROM jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((attempts, dead), (2, true));
}

/// A proxy named by the environment (`HTTP_PROXY`, `ALL_PROXY`, …) is never used for deliveries:
/// it would resolve the endpoint's name itself, past the address rule, so that a name pointing
/// at a private address would be delivered to. A worker started with one sends it nothing.
#[sqlx::test(migrations = "../migrations")]
async fn deliveries_ignore_a_proxy_named_by_the_environment(pool: PgPool) {
    use payments_tests::system::{Process, System, free_port};
    let sys = System::start(pool.clone()).await;
    let api = sys.api("").await;
    let account = sys.account("acme").await;
    let http = reqwest::Client::new();
    let created = http
        .post(format!("{}/v1/webhook_endpoints", api.url))
        .bearer_auth(&account.secret)
        .json(&json!({"url": "https://hooks.example.com/webhooks", "enabled_events": ["*"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{:?}", created.text().await);
    // A name no resolver here knows: only a proxy would take a request for it.
    sqlx::query("UPDATE webhook_endpoints SET url = 'http://hooks.internal.test/webhooks'")
        .execute(&pool)
        .await
        .unwrap();
    let answer = http
        .post(format!("{}/v1/payments", api.url))
        .bearer_auth(&account.secret)
        .header("idempotency-key", "proxied")
        .json(&json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);

    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let asked = Arc::new(AtomicUsize::new(0));
    let counting = asked.clone();
    tokio::spawn(async move {
        while let Ok((connection, _)) = proxy.accept().await {
            counting.fetch_add(1, Ordering::SeqCst);
            drop(connection);
        }
    });
    let env = vec![
        ("DATABASE_URL", sys.db_url.clone()),
        ("PAYMENTS__PROCESSOR__BASE_URL", sys.sim.url.clone()),
        ("PAYMENTS__WORKER__METRICS_PORT", "0".to_owned()),
        (SEALING_KEY.0, SEALING_KEY.1.to_owned()),
        ("HTTP_PROXY", proxy_url.clone()),
        ("http_proxy", proxy_url.clone()),
        ("HTTPS_PROXY", proxy_url.clone()),
        ("ALL_PROXY", proxy_url),
    ];
    let mut once = Process::start("payments-worker", &["--once"], &env, free_port());
    let status = tokio::time::timeout(Duration::from_secs(60), once.wait()).await;
    assert!(matches!(status, Ok(Ok(s)) if s.success()), "{status:?}: {}", once.log());
    let attempted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_attempts").fetch_one(&pool).await.unwrap();
    assert!(attempted >= 1, "the worker tried the delivery: {}", once.log());
    assert_eq!(asked.load(Ordering::SeqCst), 0, "the proxy was asked to deliver");
}
