//! What a request costs the database, counted statement by statement as the server receives
//! them: the figures the README promises. The server's connections go through a proxy that reads
//! the protocol and records every statement it is asked to run (`proxy::Recorded`): `BEGIN` and
//! `COMMIT` included, and nothing that another test in the binary does.

use std::net::SocketAddr;

use payments_tests::TestApp;
use payments_tests::proxy::{Proxy, Recorded};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::{PgPoolOptions, PgSslMode};

/// The statements recorded since the last call, but for sqlx's lookups of a type it does not
/// know (`idem_fence`, the fence record): it makes them once per connection, the first time
/// that connection binds one, and caches the answer, so they cost no request but the first on
/// each of the pool's connections.
fn take(recorded: &Recorded) -> Vec<String> {
    recorded.take().into_iter().filter(|statement| !is_type_lookup(statement)).collect()
}

/// sqlx's catalog queries for a user-defined type: its oid by name, then its kind and fields.
fn is_type_lookup(statement: &str) -> bool {
    statement.contains("::regtype::oid")
        || statement.contains("pg_catalog.pg_type")
        || statement.contains("pg_catalog.pg_attribute")
}

/// How many of the statements are a transaction's `COMMIT`.
fn commits(statements: &[String]) -> usize {
    statements.iter().filter(|s| s.trim().eq_ignore_ascii_case("commit")).count()
}

/// The API against a stand-in processor, its sessions with the database through a proxy that
/// records what they send (keep the proxy: it stops when dropped).
async fn app_through_a_proxy(pool: PgPool) -> (TestApp, Proxy, Recorded) {
    let options = pool.connect_options();
    let target: SocketAddr =
        format!("{}:{}", options.get_host(), options.get_port()).parse().unwrap();
    let (proxy, recorded) = Proxy::recording(target).await.unwrap();
    let serving = PgPoolOptions::new().connect_lazy_with(
        (*options).clone().host("127.0.0.1").port(proxy.port()).ssl_mode(PgSslMode::Disable),
    );
    let sim = payments_tests::start_sim(processor_sim::FaultConfig::default()).await;
    let app =
        TestApp::spawn_with(pool, serving, &[("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str())])
            .await;
    (app, proxy, recorded)
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_replay_costs_one_statement_and_a_new_payment_two_commits(pool: PgPool) {
    let (app, _proxy, recorded) = app_through_a_proxy(pool).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    take(&recorded);

    // The first request of a key this server has not seen looks the key up on its own.
    let response = app.post("/v1/payments", &key, Some("first"), &body).await;
    assert_eq!(response.status(), 201, "{:?}", response.text().await);
    let first = take(&recorded);
    assert_eq!(first.len(), NEW_PAYMENT.len() + 1, "auth, then as below: {first:#?}");
    assert!(first[0].contains("api_keys") && !first[0].contains("idempotency_keys"), "{first:#?}");

    recorded.take_checks();
    assert_eq!(app.post("/v1/payments", &key, Some("k"), &body).await.status(), 201);
    let new = take(&recorded);
    let new_checks = recorded.take_checks();
    assert_eq!(app.post("/v1/payments", &key, Some("k"), &body).await.status(), 201);
    let replay = take(&recorded);
    let replay_checks = recorded.take_checks();
    assert_eq!(app.post("/v1/payments", &key, Some("k"), &body).await.status(), 201);
    let kept_replay = take(&recorded);

    // No round trip but the statements': no connection is checked when it is given back (the
    // claim and the phases run on connections the engine keeps).
    assert_eq!((new_checks, replay_checks), (0, 0), "connection checks of a new payment, a replay");

    // One statement: the claim with the first phase (`idem_claim`, which checks the API key and
    // reads the stored answer), which wrote nothing: the key is there.
    assert_eq!(replay.len(), 1, "{replay:#?}");
    assert!(replay[0].contains("idem_claim"), "{replay:#?}");
    let rows: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM payments), \
                (SELECT count(*) FROM audit_events WHERE action = 'payment.created')",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows, (2, 2, 2), "the replay's statement wrote nothing");

    // The answer is kept in memory from then on: a replay reads only the credentials' version and
    // the database clock, in a statement that the replays arriving with it share (one here).
    assert_eq!(kept_replay.len(), 1, "{kept_replay:#?}");
    assert!(
        kept_replay[0].contains("idem_credentials") && !kept_replay[0].contains("idempotency_keys"),
        "{kept_replay:#?}"
    );

    // A new payment: the claim with the first phase, one statement that commits on its own
    // (`idem_claim` reads the key, finds it new and stores it; then the payment and its audit
    // record); the second phase, one statement that commits on its own too (the payment's update
    // with its audit record, the event, and the fence that stores the answer).
    assert_eq!(new.len(), NEW_PAYMENT.len(), "{new:#?}");
    for (statement, (what, parts)) in new.iter().zip(NEW_PAYMENT) {
        for part in *parts {
            assert!(statement.contains(part), "{what} should contain {part}: {new:#?}");
        }
    }
    // BEGIN and COMMIT included: 2 statements, no block: 2 transactions, both of which write
    // (issue #18: at most 8 statements, two commits).
    assert_eq!((new.len(), commits(&new)), (2, 0), "{new:#?}");
}

/// The statements of a new payment, each with the parts that identify it.
const NEW_PAYMENT: &[(&str, &[&str])] = &[
    (
        "the claim with the first phase",
        &["idem_claim", "INSERT INTO payments", "INSERT INTO audit_events"],
    ),
    (
        "the second phase",
        &["UPDATE payments", "INSERT INTO audit_events", "INSERT INTO events", "idem_commit_fence"],
    ),
];

/// The last phases of new payments that reach the database while one of them runs share one
/// statement (`idem::batch`), and each payment comes out as if its phase had run alone: its
/// answer is the payment as read back and as replayed, with its own event, webhook delivery,
/// audit record and receipt job, and its key finished. The payments differ (amounts, capture
/// methods, receipts), so that a row written with another row's values shows. The test holds the
/// events table locked, so that the first last phase waits inside its statement while the others
/// queue behind it.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn last_phases_that_arrive_together_share_a_statement(pool: PgPool) {
    const PAYMENTS: usize = 8;
    let (app, _proxy, recorded) = app_through_a_proxy(pool).await;
    let (_, key) = app.create_account("shop").await;
    let endpoint = json!({"url": "https://hooks.example.com/x", "enabled_events": ["*"]});
    assert_eq!(app.post("/v1/webhook_endpoints", &key, None, &endpoint).await.status(), 201);
    let bodies: Vec<serde_json::Value> = (0..PAYMENTS)
        .map(|i| {
            let mut body =
                json!({"amount": 500 + i, "currency": "usd", "payment_method": "pm_card_visa"});
            if i % 2 == 1 {
                body["capture_method"] = json!("manual");
            }
            if i % 3 == 0 {
                body["receipt_email"] = json!(format!("buyer-{i}@example.com"));
            }
            body
        })
        .collect();
    let keys: Vec<String> = (0..PAYMENTS).map(|i| format!("together-{i}")).collect();
    let mut lock = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE events IN EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();
    take(&recorded);

    let posts = futures::future::join_all(
        keys.iter().zip(&bodies).map(|(k, body)| app.post("/v1/payments", &key, Some(k), body)),
    );
    let release = async {
        // Every first phase committed (they write no event); the charges answer at once.
        let mut processing = 0;
        for _ in 0..500 {
            processing =
                sqlx::query_scalar("SELECT count(*) FROM payments WHERE status = 'processing'")
                    .fetch_one(&app.pool)
                    .await
                    .unwrap();
            if processing == PAYMENTS as i64 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(processing, PAYMENTS as i64, "every first phase committed");
        // Well inside `idem::batch::STUCK`, after which later phases would go alone.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        lock.commit().await.unwrap();
    };
    let (answers, ()) = tokio::join!(posts, release);
    let statements = take(&recorded);

    for ((answer, k), (i, body)) in answers.into_iter().zip(&keys).zip(bodies.iter().enumerate()) {
        assert_eq!(answer.status(), 201);
        let created: serde_json::Value = answer.json().await.unwrap();
        let id = created["id"].as_str().unwrap();
        assert_eq!(created["amount"], body["amount"]);
        let (status, event) = if i % 2 == 1 {
            ("requires_capture", "payment.requires_capture")
        } else {
            ("succeeded", "payment.succeeded")
        };
        assert_eq!(created["status"], status, "{created}");
        let captured = if i % 2 == 1 { json!(0) } else { body["amount"].clone() };
        assert_eq!(created["amount_captured"], captured, "{created}");
        let read: serde_json::Value =
            app.get(&format!("/v1/payments/{id}"), &key).await.json().await.unwrap();
        assert_eq!(created, read, "the stored answer is the payment as written");
        let replayed = app.post("/v1/payments", &key, Some(k), body).await;
        assert_eq!(replayed.status(), 201);
        assert_eq!(replayed.json::<serde_json::Value>().await.unwrap(), created, "{k} replays it");
        let written: (serde_json::Value, serde_json::Value, i64, i64) = sqlx::query_as(
            "SELECT (SELECT detail FROM audit_events WHERE object_id = $1 \
                       AND action = 'payment.charged'), \
                    (SELECT object FROM events WHERE object ->> 'id' = $1 AND type = $2), \
                    (SELECT count(*) FROM jobs j JOIN events e \
                       ON j.dedupe_key LIKE e.id || ':%' \
                      WHERE j.kind = 'webhook' AND e.object ->> 'id' = $1), \
                    (SELECT count(*) FROM jobs WHERE kind = 'receipt' AND dedupe_key = $1)",
        )
        .bind(id)
        .bind(event)
        .fetch_one(&app.pool)
        .await
        .unwrap();
        let (audit, object, deliveries, receipts) = written;
        assert_eq!(audit["charge"], created["processor_charge_id"], "{id}'s audit record");
        assert_eq!(object, created, "{id}'s event holds the payment as written");
        assert_eq!(deliveries, 1, "{id}'s event has its webhook delivery");
        let receipt = i64::from(i % 3 == 0 && i % 2 == 0);
        assert_eq!(receipts, receipt, "{id}: a receipt only when it succeeded with an address");
    }
    let finished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished' \
            AND response_status = 201",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(finished, PAYMENTS as i64);
    let last_phases = statements.iter().filter(|s| s.contains("UPDATE payments")).count();
    assert!(
        last_phases < PAYMENTS,
        "{last_phases} statements for {PAYMENTS} last phases: {statements:#?}"
    );
}
