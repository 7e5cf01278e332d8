//! Authentication at the edge: every way to present a key, and every way to be refused.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use payments_tests::{TestApp, assert_problem, json};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_bearer_key_is_accepted(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let response = app.get("/v1/payments", &key).await;
    assert_eq!(response.status(), 200);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn basic_auth_with_the_key_as_user_name_is_accepted(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    let response = app.send(app.http.get(app.url("/v1/payments")).basic_auth(&key, Some(""))).await;
    assert_eq!(response.status(), 200);
    let header = format!("Basic {}", STANDARD.encode(format!("{key}:")));
    let response =
        app.send(app.http.get(app.url("/v1/payments")).header("authorization", header)).await;
    assert_eq!(response.status(), 200);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_request_without_credentials_requires_authentication(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let response = app.send(app.http.get(app.url("/v1/payments"))).await;
    assert_eq!(
        response.headers().get("www-authenticate").and_then(|v| v.to_str().ok()),
        Some("Bearer realm=\"payments\"")
    );
    assert_problem(response, 401, "authentication_required").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn malformed_credentials_require_authentication(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    for header in ["Bearer", "Token sk_test_abc", "Basic not-base64!", "sk_test_abc"] {
        let response =
            app.send(app.http.get(app.url("/v1/payments")).header("authorization", header)).await;
        assert_problem(response, 401, "authentication_required").await;
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_unknown_key_is_invalid(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    app.create_account("shop").await;
    for key in ["sk_test_0000000000000000000000000000000", "pk_live_whatever"] {
        let response = app.get("/v1/payments", key).await;
        assert_problem(response, 401, "invalid_api_key").await;
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_revoked_key_is_invalid_and_another_key_of_the_account_still_works(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (account, first) = app.create_account("shop").await;
    let account_id = account.parse().unwrap();
    let (second_id, second) =
        payments_domain::accounts::create_key(&pool, &account_id).await.unwrap();
    assert_eq!(app.get("/v1/payments", &first).await.status(), 200);

    let first_id: String =
        sqlx::query_scalar("SELECT id FROM api_keys WHERE account_id = $1 AND id <> $2")
            .bind(&account)
            .bind(second_id.id.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
    payments_domain::accounts::revoke_key(&pool, &first_id.parse().unwrap()).await.unwrap();

    assert_problem(app.get("/v1/payments", &first).await, 401, "invalid_api_key").await;
    assert_eq!(app.get("/v1/payments", second.expose()).await.status(), 200);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_plaintext_key_is_nowhere_in_the_database(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (_, key) = app.create_account("shop").await;
    let random_part = &key["sk_test_".len()..];

    // Every row of every table of ours, as text, and the key's digest stored as bytes.
    let dump: Vec<String> = sqlx::query_scalar(
        "SELECT row_to_json(t)::text FROM accounts t UNION ALL SELECT row_to_json(k)::text FROM api_keys k",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!dump.is_empty());
    for row in &dump {
        assert!(!row.contains(random_part), "the key appears in {row}");
    }
    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT key_hash FROM api_keys").fetch_one(&pool).await.unwrap();
    assert_eq!(stored, payments_domain::accounts::key_digest(&key).to_vec());
    assert_ne!(stored, key.as_bytes());
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn each_account_sees_an_answer_for_its_own_key(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, a) = app.create_account("a").await;
    let (_, b) = app.create_account("b").await;
    assert_ne!(a, b);
    for key in [a, b] {
        let body = json(app.get("/v1/payments", &key).await).await;
        assert_eq!(body["object"], "list");
    }
}

/// A key this server has seen and then revoked: the next money-moving request does not look it up
/// first (its account is known), so each way of answering before or at the claim must still
/// notice the revocation.
async fn seen_then_revoked(app: &TestApp, name: &str) -> (String, String) {
    let (account, key) = app.create_account(name).await;
    let body =
        serde_json::json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    assert_eq!(app.post("/v1/payments", &key, Some("before"), &body).await.status(), 201);
    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE account_id = $1")
        .bind(&account)
        .execute(&app.pool)
        .await
        .unwrap();
    (account, key)
}

/// Authentication is the first check (api.md): a path whose id cannot be a payment's does not
/// answer `404` to a request that has not said who it is.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_money_moving_request_with_an_odd_path_and_no_key_is_a_401(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    for path in ["/v1/payments/%FF/capture", "/v1/payments/%FF/cancel", "/v1/payments/%FF/refunds"]
    {
        let request = app
            .http
            .post(app.url(path))
            .header("idempotency-key", "k")
            .json(&serde_json::json!({}));
        assert_problem(app.send(request).await, 401, "authentication_required").await;
    }
}

/// Once a lookup has found a key revoked (here a `GET`'s), a money-moving request with it is
/// refused before its body is read: the key is no longer taken for live by the requests that
/// trust the keys seen before. Here the body never comes; the answer must not wait for it.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_key_found_revoked_is_refused_before_a_body_is_read(pool: PgPool) {
    let (app, _sim) = payments_tests::spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = seen_then_revoked(&app, "revoked").await;
    assert_problem(app.get("/v1/payments", &key).await, 401, "invalid_api_key").await;

    let address = app.address.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Idempotency-Key: stalled\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await;
    let n = read.expect("answered without waiting for the body").unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_key_revoked_after_use_is_refused_first_on_every_money_moving_path(pool: PgPool) {
    let (app, _sim) = payments_tests::spawn_with_sim(pool.clone(), &[]).await;
    let body =
        serde_json::json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});

    // The claim checks the key: no replay of the answer stored before the revocation…
    let (_, key) = seen_then_revoked(&app, "replay").await;
    let replay = app.post("/v1/payments", &key, Some("before"), &body).await;
    assert!(replay.headers().get("idempotent-replayed").is_none());
    assert_problem(replay, 401, "invalid_api_key").await;

    // …and no new key claimed.
    let (account, key) = seen_then_revoked(&app, "new").await;
    assert_problem(
        app.post("/v1/payments", &key, Some("after"), &body).await,
        401,
        "invalid_api_key",
    )
    .await;
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM idempotency_keys WHERE account_id = $1")
            .bind(&account)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(keys, ["before"], "a refused request stores nothing");

    // Every refusal before the claim answers 401 rather than what else is wrong.
    let (_, key) = seen_then_revoked(&app, "no idempotency key").await;
    assert_problem(app.post("/v1/payments", &key, None, &body).await, 401, "invalid_api_key").await;

    let (_, key) = seen_then_revoked(&app, "media type").await;
    let request = app
        .http
        .post(app.url("/v1/payments"))
        .bearer_auth(&key)
        .header("idempotency-key", "m")
        .header("content-type", "text/plain")
        .body("amount=500");
    assert_problem(app.send(request).await, 401, "invalid_api_key").await;

    let (_, key) = seen_then_revoked(&app, "unparsable").await;
    let unparsable = serde_json::json!({"amount": "five hundred"});
    assert_problem(
        app.post("/v1/payments", &key, Some("u"), &unparsable).await,
        401,
        "invalid_api_key",
    )
    .await;

    let (_, key) = seen_then_revoked(&app, "invalid").await;
    let invalid =
        serde_json::json!({"amount": -5, "currency": "usd", "payment_method": "pm_card_visa"});
    assert_problem(
        app.post("/v1/payments", &key, Some("i"), &invalid).await,
        401,
        "invalid_api_key",
    )
    .await;

    let (_, key) = seen_then_revoked(&app, "bad capture").await;
    let capture = serde_json::json!({"amount_to_capture": 0});
    let path = "/v1/payments/pay_nope/capture";
    assert_problem(app.post(path, &key, Some("c"), &capture).await, 401, "invalid_api_key").await;

    for path in [
        "/v1/payments/pay_nope/capture",
        "/v1/payments/pay_nope/cancel",
        "/v1/payments/pay_nope/refunds",
    ] {
        let (_, key) = seen_then_revoked(&app, path).await;
        let empty = serde_json::json!({});
        assert_problem(app.post(path, &key, Some("p"), &empty).await, 401, "invalid_api_key").await;
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_key_revoked_after_use_is_refused_before_its_rate_limit(pool: PgPool) {
    let sim = payments_tests::start_sim(Default::default()).await;
    let app = TestApp::spawn_with(
        pool.clone(),
        pool,
        &[
            ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
            ("PAYMENTS__RATE_LIMIT__PER_SECOND", "1"),
            ("PAYMENTS__RATE_LIMIT__BURST", "1"),
        ],
    )
    .await;
    let (_, key) = seen_then_revoked(&app, "limited").await;
    let body =
        serde_json::json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    assert_problem(app.post("/v1/payments", &key, Some("l"), &body).await, 401, "invalid_api_key")
        .await;
}
