//! The HTTP edge: request ids, problem details, limits, health and readiness.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use payments_tests::proxy::Proxy;
use payments_tests::{TestApp, assert_problem, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

fn request_id(response: &reqwest::Response) -> String {
    let id = response.headers().get("request-id").expect("every response has a Request-Id");
    id.to_str().unwrap().to_owned()
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn every_response_has_a_unique_request_id(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let mut seen = HashSet::new();
    for path in ["/healthz", "/readyz", "/v1/payments", "/v1/nope", "/problems/card_declined"] {
        for _ in 0..3 {
            let response = app.get(path, &key).await;
            let id = request_id(&response);
            assert!(id.starts_with("req_") && id.len() > 20, "{id}");
            assert!(seen.insert(id.clone()), "request id {id} was given twice");
        }
    }
    // Failed authentication too.
    let response = app.send(app.http.get(app.url("/v1/payments"))).await;
    assert!(seen.insert(request_id(&response)));
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_unknown_url_is_resource_missing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let body =
        assert_problem(app.get("/v1/nothing-here", &key).await, 404, "resource_missing").await;
    assert!(body["detail"].as_str().unwrap().contains("/v1/nothing-here"));
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_method_the_route_does_not_accept_is_a_problem(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let response = app.send(app.http.delete(app.url("/v1/payments"))).await;
    assert_problem(response, 405, "method_not_allowed").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn malformed_list_parameters_name_the_parameter(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let cases = [
        ("limit=abc", "limit"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=-1", "limit"),
        ("starting_after=pay_a&ending_before=pay_b", "ending_before"),
        ("starting_after=re_123", "starting_after"),
        ("colour=blue", "colour"),
    ];
    for (query, param) in cases {
        let response = app.get(&format!("/v1/payments?{query}"), &key).await;
        let body = assert_problem(response, 400, "invalid_request").await;
        assert_eq!(body["param"], param, "for ?{query}: {body}");
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_payment_list_has_the_list_shape(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let response = app.get("/v1/payments?limit=100", &key).await;
    assert_eq!(response.status(), 200);
    let body = json(response).await;
    assert_eq!(
        body,
        serde_json::json!({"object": "list", "data": [], "has_more": false, "url": "/v1/payments"})
    );
    let response = app.get("/v1/payments?starting_after=pay_unknown", &key).await;
    let body = assert_problem(response, 404, "resource_missing").await;
    assert_eq!(body["param"], "starting_after");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_body_over_the_limit_is_refused_before_it_is_read(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let response = app
        .send(
            app.http
                .get(app.url("/v1/payments"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(vec![b' '; 64 * 1024 + 1]),
        )
        .await;
    assert_problem(response, 413, "payload_too_large").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn every_problem_type_has_a_documentation_page(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    for code in payments_api::ProblemCode::ALL {
        let response = app.send(app.http.get(app.url(&format!("/problems/{code}")))).await;
        assert_eq!(response.status(), 200, "{code}");
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/html"), "{content_type}");
        let page = response.text().await.unwrap();
        assert!(page.contains(code.title()) && page.contains(code.as_str()), "{code}");
    }
    let response = app.send(app.http.get(app.url("/problems/no_such_problem"))).await;
    assert_problem(response, 404, "resource_missing").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_public_base_url_setting_shapes_problem_types(pool: PgPool) {
    let app = TestApp::spawn_with(
        pool.clone(),
        pool,
        &[("PAYMENTS__HTTP__PUBLIC_BASE_URL", "https://pay.example.com/")],
    )
    .await;
    let body = json(app.send(app.http.get(app.url("/v1/payments"))).await).await;
    assert_eq!(body["type"], "https://pay.example.com/problems/authentication_required");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn health_answers_without_authentication(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let response = app.send(app.http.get(app.url("/healthz"))).await;
    assert_eq!(response.status(), 200);
    assert_eq!(json(response).await["status"], "ok");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn readiness_fails_while_the_database_is_unreachable_and_recovers(pool: PgPool) {
    let options = pool.connect_options();
    let target: SocketAddr =
        format!("{}:{}", options.get_host(), options.get_port()).parse().unwrap();
    let proxy = Proxy::start(target).await.unwrap();
    let serving_pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy_with((*options).clone().host("127.0.0.1").port(proxy.port()));
    let app = TestApp::spawn_with(pool, serving_pool, &[]).await;

    let ready = app.send(app.http.get(app.admin_url("/readyz"))).await;
    assert_eq!(ready.status(), 200);
    assert_eq!(json(ready).await["checks"]["database"], "ok");
    // The public listener says as much by its status, and nothing of what it checked.
    let terse = app.send(app.http.get(app.url("/readyz"))).await;
    assert_eq!(terse.status(), 200);
    assert_eq!(json(terse).await, serde_json::json!({"status": "ready"}));

    proxy.block();
    let terse = app.send(app.http.get(app.url("/readyz"))).await;
    assert_eq!(terse.status(), 503);
    assert_eq!(json(terse).await, serde_json::json!({"status": "unavailable"}));
    let unready = app.send(app.http.get(app.admin_url("/readyz"))).await;
    assert_eq!(unready.status(), 503);
    let unready = json(unready).await;
    assert_eq!(unready["status"], "unavailable");
    // Unknown, not "none missing".
    assert_eq!(unready["checks"]["missing_migrations"], serde_json::Value::Null);
    // Liveness does not depend on the database.
    assert_eq!(app.send(app.http.get(app.url("/healthz"))).await.status(), 200);

    proxy.unblock();
    let mut status = 0;
    for _ in 0..50 {
        status = app.send(app.http.get(app.url("/readyz"))).await.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "readiness recovers once the database is back");
}

#[sqlx::test(migrations = false)]
async fn readiness_fails_while_migrations_are_missing(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let response = app.send(app.http.get(app.admin_url("/readyz"))).await;
    assert_eq!(response.status(), 503);
    assert_eq!(json(response).await["checks"]["schema_version"], serde_json::Value::Null);
    payments_api::MIGRATOR.run(&pool).await.unwrap();
    assert_eq!(app.send(app.http.get(app.url("/readyz"))).await.status(), 200);
}

/// A rolling deploy applies the next release's migrations while this one still serves: a schema
/// ahead of the binary keeps it ready, and only a migration of its own that is missing does not.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn readiness_holds_when_the_schema_is_ahead_and_fails_when_one_migration_is_missing(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let ours = payments_api::MIGRATOR.iter().map(|m| m.version).max().unwrap();
    let next = ours + 1;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'the next release', true, '\\x00', 1)",
    )
    .bind(next)
    .execute(&pool)
    .await
    .unwrap();
    let ahead = app.send(app.http.get(app.admin_url("/readyz"))).await;
    assert_eq!(ahead.status(), 200, "a newer schema must not take the old release out");
    let checks = json(ahead).await["checks"].clone();
    assert_eq!(
        (checks["schema_version"].as_i64(), checks["missing_migrations"].as_i64()),
        (Some(next), Some(0))
    );
    assert_eq!(checks["expected_schema_version"].as_i64(), Some(ours));

    // A migration of its own applied with other contents is not its own.
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = $1")
        .bind(ours)
        .execute(&pool)
        .await
        .unwrap();
    let edited = app.send(app.http.get(app.admin_url("/readyz"))).await;
    assert_eq!(edited.status(), 503);
    assert_eq!(json(edited).await["checks"]["missing_migrations"].as_i64(), Some(1));

    // One of this binary's own migrations gone (here: its newest) is "behind", whatever the
    // newest version says.
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(ours)
        .execute(&pool)
        .await
        .unwrap();
    let behind = app.send(app.http.get(app.admin_url("/readyz"))).await;
    assert_eq!(behind.status(), 503);
    let checks = json(behind).await["checks"].clone();
    assert_eq!(
        (checks["schema_version"].as_i64(), checks["missing_migrations"].as_i64()),
        (Some(next), Some(1))
    );
}

/// Every operation of the OpenAPI document is served, and its path serves no other method.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_openapi_document_and_the_router_agree(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let response = app.send(app.http.get(app.url("/openapi.json"))).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let document = json(response).await;
    assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = document["paths"].as_object().unwrap();
    let operations: usize = paths.values().map(|item| item.as_object().unwrap().len()).sum();
    // `/metrics` is on the admin listener, apart from the API and its document.
    assert_eq!((paths.len(), operations), (16, 22), "{:?}", paths.keys());
    for (template, item) in paths {
        let path = template
            .replace("{id}", if template.starts_with("/v1/refunds") { "re_x" } else { "pay_x" })
            .replace("{code}", "card_declined");
        let documented: Vec<&str> = item.as_object().unwrap().keys().map(String::as_str).collect();
        for method in ["get", "post", "patch", "put", "delete"] {
            let request = app
                .http
                .request(method.to_uppercase().parse().unwrap(), app.url(&path))
                .bearer_auth(&key)
                .header("Idempotency-Key", format!("probe-{method}-{path}"))
                .header("Content-Type", "application/json")
                .body("{}");
            let response = app.send(request).await;
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            if documented.contains(&method) {
                assert_ne!(status, 405, "{method} {template} is documented but not served");
                assert!(!body.contains("Unrecognized request URL"), "{method} {template}: {body}");
            } else {
                assert_eq!(status, 405, "{method} {template} is served but not documented: {body}");
            }
        }
    }
}
