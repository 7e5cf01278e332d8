//! The delivery log as an account sees it: a coarse outcome per attempt (a timeout, a refused
//! connection, a TLS error, a refused address, the receiver's status), never the error's text or
//! the attempt's timing, which would turn blind deliveries into a scanner of whatever the worker
//! can reach; the operator keeps the whole error.

use std::collections::BTreeSet;

use payments_tests::{json, spawn_with_sim};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::webhooks::{pass, worker};

/// A listener that reads the request of every connection, answers `reply` (nothing: never
/// answers) and holds the connection open; its port.
async fn listener(reply: &'static [u8]) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut connection, _)) = listener.accept().await {
            // The request first (a client may take an answer sent before it as garbage).
            let _ = connection.read(&mut [0; 4096]).await;
            let _ = connection.write_all(reply).await;
            held.push(connection);
        }
    });
    port
}

#[sqlx::test(migrations = "../migrations")]
async fn the_delivery_log_shows_the_account_coarse_outcomes_only(pool: PgPool) {
    let (app, sim) =
        spawn_with_sim(pool.clone(), &[("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true")]).await;
    let (_, key) = app.create_account("acme").await;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let silent = listener(b"").await;
    let failing =
        listener(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n").await;
    // The URL, what the account is shown (the class, the status), and a piece of what the
    // operator is.
    let cases = [
        (format!("http://127.0.0.1:{closed_port}/hooks"), "connection_refused", None, "refused"),
        (format!("http://127.0.0.1:{silent}/hooks"), "timeout", None, "timed out"),
        (format!("https://127.0.0.1:{failing}/hooks"), "tls_error", None, "https://127.0.0.1"),
        (format!("http://127.0.0.1:{failing}/hooks"), "http_status", Some(500), "answered 500"),
        // Registered before the rule refused it (a URL the rule refuses now cannot be).
        ("http://10.0.0.1:22/hooks".to_owned(), "refused_address", None, "public Internet"),
    ];
    let mut endpoints = Vec::new();
    for (url, ..) in &cases {
        let placeholder = json!({"url": "https://hooks.example.com/", "enabled_events": ["*"]});
        let created = json(app.post("/v1/webhook_endpoints", &key, None, &placeholder).await).await;
        let id = created["id"].as_str().expect("an id").to_owned();
        sqlx::query("UPDATE webhook_endpoints SET url = $1 WHERE id = $2")
            .bind(url)
            .bind(&id)
            .execute(&pool)
            .await
            .unwrap();
        endpoints.push(id);
    }
    let payment = json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"});
    let answer = app.post("/v1/payments", &key, Some("p1"), &payment).await;
    assert_eq!(answer.status(), 201);
    // One attempt each: the next is an hour away.
    pass(&worker(&pool, &sim, &[("PAYMENTS__WEBHOOKS__BACKOFF_BASE_MS", "3600000")])).await;

    let shown: BTreeSet<&str> =
        ["object", "event", "attempt", "status_code", "error", "outcome", "created"].into();
    for ((url, error, status, detail), id) in cases.iter().zip(&endpoints) {
        let log = json(app.get(&format!("/v1/webhook_endpoints/{id}/attempts"), &key).await).await;
        let attempt = &log["data"][0];
        assert_eq!(attempt["error"], *error, "{url}: {log}");
        assert_eq!(attempt["status_code"], json!(status), "{url}: {log}");
        let members: BTreeSet<&str> =
            attempt.as_object().expect("an attempt").keys().map(String::as_str).collect();
        assert_eq!(members, shown, "{url}: no timing, no error text");
        // The operator keeps the whole error.
        let kept: String = sqlx::query_scalar(
            "SELECT last_error FROM jobs WHERE kind = 'webhook' AND payload->>'endpoint_id' = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(kept.contains(detail), "{url}: {kept}");
    }

    // Rows written before the log kept classes show a class too, never their text.
    sqlx::query(
        "INSERT INTO webhook_attempts
                (endpoint_id, event_id, attempt, status_code, error, duration_ms, outcome)
         SELECT $1, id, 9, NULL, 'error sending request: tcp connect error: Connection refused \
                (os error 111)', 3, 'retrying' FROM events
         UNION ALL
         SELECT $1, id, 10, 503, 'answered 503', 3, 'retrying' FROM events",
    )
    .bind(&endpoints[0])
    .execute(&pool)
    .await
    .unwrap();
    let log =
        json(app.get(&format!("/v1/webhook_endpoints/{}/attempts", endpoints[0]), &key).await)
            .await;
    let old: Vec<(Value, Value)> = log["data"].as_array().expect("a log")[..2]
        .iter()
        .map(|a| (a["error"].clone(), a["status_code"].clone()))
        .collect();
    assert_eq!(
        old,
        [(json!("http_status"), json!(503)), (json!("connection_error"), Value::Null)],
        "{log}"
    );
}
