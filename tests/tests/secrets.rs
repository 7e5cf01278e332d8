//! Secrets at rest, end to end: a webhook endpoint's signing secret is sealed in its row and in
//! the stored answer of its creation, and a replay still answers it byte for byte, from a server
//! that keeps the answer in memory or from one that reads it, and after the sealing key was
//! replaced. And no `Debug` of what holds a secret prints it.

use payments_tests::{SEALING_KEY, TestApp, json};
use serde_json::{Value, json};
use sqlx::PgPool;

/// Another sealing key than the tests' own.
const NEXT_KEY: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";

/// Whether `haystack` holds `needle`'s bytes anywhere.
fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
}

#[sqlx::test(migrations = "../migrations")]
async fn a_keyed_creation_keeps_its_secret_sealed_and_every_replay_answers_it_in_plain(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let (_, key) = app.create_account("acme").await;
    let body = json!({"url": "https://hooks.example.com/a", "enabled_events": ["*"]});
    let first = app.post("/v1/webhook_endpoints", &key, Some("we-sealed"), &body).await;
    assert_eq!(first.status(), 201);
    let first = first.bytes().await.unwrap();
    let created: Value = serde_json::from_slice(&first).unwrap();
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_") && secret.len() > 30, "{created}");
    let random = &secret["whsec_".len()..];

    // Neither the endpoint's row nor the stored answer holds it in plain text.
    let row: Vec<u8> =
        sqlx::query_scalar("SELECT secret FROM webhook_endpoints").fetch_one(&pool).await.unwrap();
    assert!(!holds(&row, random), "the row holds the plain secret");
    let stored: Vec<u8> = sqlx::query_scalar(
        "SELECT response_body FROM idempotency_keys WHERE idempotency_key = 'we-sealed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(!holds(&stored, random), "the stored answer holds the plain secret");
    let stored: Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(stored["id"], created["id"]);
    assert_ne!(stored["secret"], created["secret"]);

    // A replay from this server (its answer kept in memory), from another one (read from the
    // database), and from one whose sealing key was replaced since (the old one listed as old):
    // the first answer, byte for byte.
    let rotated =
        [(SEALING_KEY.0, NEXT_KEY), ("PAYMENTS__WEBHOOKS__OLD_SEALING_KEYS", SEALING_KEY.1)];
    let other = TestApp::spawn(pool.clone()).await;
    let after_rotation = TestApp::spawn_with(pool.clone(), pool.clone(), &rotated).await;
    for server in [&app, &other, &after_rotation] {
        let replay = server.post("/v1/webhook_endpoints", &key, Some("we-sealed"), &body).await;
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.bytes().await.unwrap(), first, "the same answer, secret included");
    }

    // A server without the key that sealed it answers an error, never the sealed text.
    let forgotten = TestApp::spawn_with(pool.clone(), pool, &[(SEALING_KEY.0, NEXT_KEY)]).await;
    let replay = forgotten.post("/v1/webhook_endpoints", &key, Some("we-sealed"), &body).await;
    assert_eq!(replay.status(), 500);
    let problem = json(replay).await;
    assert_eq!(problem["code"], "internal_error");
    assert!(!problem.to_string().contains(stored["secret"].as_str().unwrap()), "{problem}");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_unkeyed_creation_answers_its_secret_and_keeps_it_sealed(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (_, key) = app.create_account("acme").await;
    let body = json!({"url": "https://hooks.example.com/a", "enabled_events": ["*"]});
    let created = json(app.post("/v1/webhook_endpoints", &key, None, &body).await).await;
    let secret = created["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_") && secret.len() > 30, "{created}");
    let row: Vec<u8> =
        sqlx::query_scalar("SELECT secret FROM webhook_endpoints").fetch_one(&pool).await.unwrap();
    assert!(!holds(&row, &secret["whsec_".len()..]), "the row holds the plain secret");
    // Shown once: never again on a read.
    let id = created["id"].as_str().unwrap();
    let read = json(app.get(&format!("/v1/webhook_endpoints/{id}"), &key).await).await;
    assert_eq!(read["id"], created["id"]);
    assert!(read.get("secret").is_none_or(Value::is_null), "{read}");
}

#[test]
fn no_debug_of_what_holds_a_secret_prints_it() {
    let account = payments_tests::system::Account {
        id: "acct_1".into(),
        secret: "sk_test_hunter2hunter2".into(),
    };
    let endpoint = payments_api::routes::webhook_endpoints::WebhookEndpointDoc {
        id: "we_1".into(),
        object: "webhook_endpoint".into(),
        url: "https://example.com/hook".into(),
        enabled_events: vec!["*".into()],
        status: "enabled".into(),
        created: 0,
        secret: Some("whsec_swordfishswordfish".into()),
    };
    let printed = format!("{account:?} {endpoint:?}");
    assert!(printed.contains("acct_1") && printed.contains("we_1"), "{printed}");
    for secret in ["hunter2", "swordfish"] {
        assert!(!printed.contains(secret), "{secret} in {printed}");
    }
}
