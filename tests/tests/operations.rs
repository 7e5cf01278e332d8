//! What operators rely on: metrics (on the admin listener, never the public one) and per-account
//! rate limits.

use payments_tests::{TestApp, assert_problem, json, spawn_with_sim};
use serde_json::json;
use sqlx::PgPool;

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn metrics_count_requests_by_route_replays_and_processor_calls(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    // Created, replayed from the database, replayed from memory.
    for _ in 0..3 {
        assert_eq!(app.post("/v1/payments", &key, Some("m1"), &body).await.status(), 201);
    }
    let id = "pay_doesnotexist000000000000";
    assert_eq!(app.get(&format!("/v1/payments/{id}"), &key).await.status(), 404);

    // Not on the public listener.
    let public = app.send(app.http.get(app.url("/metrics"))).await;
    assert_problem(public, 404, "resource_missing").await;
    let response = app.send(app.http.get(app.admin_url("/metrics"))).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = response.text().await.unwrap();
    for expected in [
        r#"http_requests_total{method="POST",route="/v1/payments",status="201"}"#,
        r#"http_requests_total{method="GET",route="/v1/payments/{id}",status="404"}"#,
        r#"http_request_duration_seconds_bucket{method="POST",route="/v1/payments""#,
        r#"idempotency_events_total{event="replayed"}"#,
        r#"idempotency_events_total{event="answered_from_memory"}"#,
        r#"idempotency_events_total{event="claimed"}"#,
        r#"processor_calls_total{path="/v1/payment_intents",outcome="ok"}"#,
    ] {
        assert!(text.contains(expected), "missing {expected} in:\n{text}");
    }
    assert!(!text.contains(id), "raw paths never become labels");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_account_over_its_rate_is_told_when_to_retry_and_nothing_is_stored(pool: PgPool) {
    let sim = payments_tests::start_sim(Default::default()).await;
    let app = TestApp::spawn_with(
        pool.clone(),
        pool.clone(),
        &[
            ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
            ("PAYMENTS__RATE_LIMIT__PER_SECOND", "1"),
            ("PAYMENTS__RATE_LIMIT__BURST", "2"),
        ],
    )
    .await;
    let (_, busy) = app.create_account("busy").await;
    let (_, calm) = app.create_account("calm").await;
    assert_eq!(app.get("/v1/payments", &busy).await.status(), 200);
    assert_eq!(app.get("/v1/payments", &busy).await.status(), 200);
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    let limited = app.post("/v1/payments", &busy, Some("k"), &body).await;
    assert_eq!(limited.headers()["retry-after"], "1");
    assert_problem(limited, 429, "rate_limited").await;
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys").fetch_one(&pool).await.unwrap();
    assert_eq!(stored, 0, "a limited request stores nothing against its key");
    assert_eq!(app.get("/v1/payments", &calm).await.status(), 200, "limits are per account");

    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(app.post("/v1/payments", &busy, Some("k"), &body).await.status(), 201);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_admin_listener_serves_metrics_and_readiness_checks_and_the_public_one_neither(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    assert_ne!(app.admin_address, app.address);
    let admin = |path: &'static str| app.send(app.http.get(app.admin_url(path)));
    let metrics = admin("/metrics").await;
    assert_eq!(metrics.status(), 200);
    assert!(metrics.text().await.unwrap().contains("# TYPE"), "Prometheus text");
    let ready = json(admin("/readyz").await).await;
    assert_eq!((&ready["status"], &ready["checks"]["database"]), (&json!("ready"), &json!("ok")));
    assert_eq!(admin("/healthz").await.status(), 200);
    // Only those three: the API is not served there.
    assert_eq!(admin("/v1/payments").await.status(), 404);
    assert_eq!(admin("/openapi.json").await.status(), 404);

    // The public listener: no metrics, a readiness without its checks, and neither in its
    // document.
    let public = app.send(app.http.get(app.url("/metrics"))).await;
    assert_problem(public, 404, "resource_missing").await;
    let ready = json(app.send(app.http.get(app.url("/readyz"))).await).await;
    assert_eq!(ready, json!({"status": "ready"}));
    let document = json(app.send(app.http.get(app.url("/openapi.json"))).await).await;
    assert!(document["paths"].get("/metrics").is_none(), "{}", document["paths"]);
    assert!(document["paths"].get("/readyz").is_some());
}
