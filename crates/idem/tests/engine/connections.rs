//! The connections the engine keeps beside the pool for claims and one-statement phases: cut by
//! a restart, reaching a read-only node, never answering, closing with the pool.

use std::sync::Arc;
use std::time::Duration;

use idem::{Claim, Engine, EngineConfig, Lease, Operation, PhaseError, Step};
use serde_json::json;
use sqlx::{PgConnection, PgPool};

use crate::helpers::{Harness, Point, harness, harness_with, key, order_claim};

#[sqlx::test(migrations = "../../migrations")]
async fn claims_run_on_the_pool_when_the_engine_keeps_no_claim_connections(pool: PgPool) {
    let config = EngineConfig { claim_connections: 0, ..EngineConfig::default() };
    let h = harness_with(pool, config).await;
    let first = h.run(h.acquire("k1").await).await.unwrap();
    match h.claim("k1").await {
        Claim::Replay(replayed) => assert_eq!(replayed, first),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(matches!(
        h.claim_as("acct_1", "k1", &json!({"item": "pen"})).await,
        Claim::Mismatch { .. }
    ));
}

#[sqlx::test(migrations = "../../migrations")]
async fn claims_survive_their_connections_being_cut(pool: PgPool) {
    let h = harness(pool).await;
    let first = h.run(h.acquire("k0").await).await.unwrap();
    // Claims at once make claim connections (up to eight); then the server cuts them all (as a
    // restart would), and the next claims come before any of them sat idle for a second (when
    // it would be checked before it is lent).
    let h = &h;
    let claims = futures::future::join_all((1..=16).map(|i| async move {
        let key = format!("k{i}");
        h.claim(&key).await
    }))
    .await;
    assert!(claims.iter().all(|claim| matches!(claim, Claim::Acquired(_))), "{claims:?}");
    let cut = h.cut_sessions().await;
    assert!(!cut.is_empty(), "the claim connections were open: {cut:?}");

    // No claim fails for it: a claim on a cut connection is sent again on another.
    for i in 17..=40 {
        assert!(matches!(h.claim(&format!("k{i}")).await, Claim::Acquired(_)), "claim {i}");
    }
    match h.claim("k0").await {
        Claim::Replay(replayed) => assert_eq!(replayed, first),
        other => panic!("expected a replay, got {other:?}"),
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn claim_connections_that_reached_a_read_only_node_connect_again(pool: PgPool) {
    let h = harness(pool).await;
    // One session that stays writable, for the settings below.
    let mut admin = h.pool.acquire().await.unwrap();
    let database: String =
        sqlx::query_scalar("SELECT current_database()").fetch_one(&mut *admin).await.unwrap();
    // New sessions cannot write, as on a standby: the claims connect and fail.
    sqlx::query(&format!("ALTER DATABASE \"{database}\" SET default_transaction_read_only = on"))
        .execute(&mut *admin)
        .await
        .unwrap();
    let requests: Vec<_> =
        (0..16).map(|i| (key(&format!("ro{i}")), json!({"item": "book"}))).collect();
    let failed = futures::future::join_all(requests.iter().map(|(key, body)| {
        let engine = &h.engine;
        async move { engine.claim(&order_claim("acct_1", key, body)).await }
    }))
    .await;
    assert!(failed.iter().all(Result::is_err), "claims on read-only sessions failed: {failed:?}");
    // The primary is reachable again (a failover's new primary behind the same address). A claim
    // connection kept with its read-only session would fail every claim it serves from now on.
    sqlx::query(&format!("ALTER DATABASE \"{database}\" RESET default_transaction_read_only"))
        .execute(&mut *admin)
        .await
        .unwrap();
    for i in 0..40 {
        assert!(matches!(h.claim(&format!("rw{i}")).await, Claim::Acquired(_)), "claim {i}");
    }
}

#[tokio::test]
async fn a_claim_gives_up_connecting_after_the_pools_acquire_timeout() {
    // A server that completes the TCP handshake and then never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let options = sqlx::postgres::PgConnectOptions::new().host("127.0.0.1").port(port);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy_with(options);
    let engine = Engine::new(pool, EngineConfig::default(), Arc::new(idem::NoObserver));
    let (key, body) = (key("k1"), json!({"item": "book"}));
    let request = order_claim("acct_1", &key, &body);
    let claimed = tokio::time::timeout(Duration::from_secs(10), engine.claim(&request)).await;
    let claimed = claimed.expect("the claim answers instead of waiting for the server forever");
    assert!(matches!(claimed, Err(idem::IdemError::Database(sqlx::Error::PoolTimedOut))));
}

/// A one-statement phase that reports the server session it ran on, after `pause` in the server.
async fn ship_slowly(lease: &mut Lease, pause: Duration) -> Result<i32, PhaseError<String>> {
    let step = Step::Next(Point::Shipped);
    lease
        .phase_in_one(step, async |connection, fence| {
            let (key_id, pid) = sqlx::query_as(
                "WITH pause AS (SELECT pg_sleep($2)), \
                      fence AS (SELECT idem_commit_fence($1) AS key_id FROM pause) \
                 SELECT key_id, pg_backend_pid() FROM fence",
            )
            .bind(fence)
            .bind(pause.as_secs_f64())
            .fetch_one(connection)
            .await?;
            Ok((key_id, pid))
        })
        .await
}

impl Harness {
    /// Ends every server session of this test's database but the asking one, as a restart would:
    /// whether each was ended.
    async fn cut_sessions(&self) -> Vec<bool> {
        sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// A key taken to `order_created`, then moved by a one-statement phase: the session it ran on.
    async fn ship_in_one(&self, key_value: &str) -> i32 {
        let mut lease = self.acquire(key_value).await;
        self.operation().step(&mut lease, Point::Started).await.unwrap();
        ship_slowly(&mut lease, Duration::ZERO).await.unwrap()
    }
}

/// One-statement phases run on connections the engine keeps beside the pool, given back as they
/// are when the statement returned: the next phase runs on the same session.
#[sqlx::test(migrations = "../../migrations")]
async fn one_statement_phases_reuse_a_kept_connection(pool: PgPool) {
    let config = EngineConfig { phase_connections: 1, ..EngineConfig::default() };
    let h = harness_with(pool, config).await;
    let first = h.ship_in_one("a").await;
    assert_eq!(h.ship_in_one("b").await, first);

    // A phase cut off in the middle of its statement (its future dropped) leaves the session
    // half way through an answer: it is checked, which waits for the rest, and taken back. The
    // next phase waits for it (one connection is kept) and runs on the same session.
    let mut lease = h.acquire("cut").await;
    h.operation().step(&mut lease, Point::Started).await.unwrap();
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        ship_slowly(&mut lease, Duration::from_millis(500)),
    )
    .await;
    assert!(cut.is_err(), "the phase was cut off");
    assert_eq!(h.ship_in_one("after").await, first, "the same session, checked and kept");
    // The cut statement ran to its end in the server: it committed on its own.
    assert_eq!(h.recovery_point("cut").await, "shipped");
}

/// When the server ends the kept connections' sessions (a restart), the next one-statement phases
/// connect again instead of failing on a dead session.
#[sqlx::test(migrations = "../../migrations")]
async fn one_statement_phases_survive_their_connections_being_cut(pool: PgPool) {
    let h = harness(pool).await;
    let before = h.ship_in_one("before").await;
    let cut = h.cut_sessions().await;
    assert!(cut.len() >= 2, "the kept connection and a claim connection were open: {cut:?}");
    // A connection idle for a second is checked before it is lent, as the pool's are.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for i in 0..4 {
        assert_ne!(h.ship_in_one(&format!("after{i}")).await, before, "a new session");
    }
}

/// The kept connections close with the pool, as the pool's own do.
#[sqlx::test(migrations = "../../migrations")]
async fn kept_connections_close_with_the_pool(pool: PgPool) {
    let h = harness(pool).await;
    h.ship_in_one("k").await;
    let options = h.pool.connect_options();
    let mut watcher = <PgConnection as sqlx::Connection>::connect_with(&options).await.unwrap();
    h.pool.close().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if open == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{open} sessions still open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
