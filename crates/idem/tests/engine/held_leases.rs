//! A shutdown (`release_held`) gives back every lease the process holds, and any granted while it
//! looks, so that another process resumes the keys at once.

use std::sync::Arc;
use std::time::Duration;

use idem::{Claim, Engine, EngineConfig, Event, Interrupted, drive};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Insert, harness, key, order_claim};

#[sqlx::test(migrations = "../../migrations")]
async fn a_shutdown_waits_for_a_new_key_on_its_way_and_leaves_it_free(pool: PgPool) {
    let h = harness(pool).await;
    let mut lease = h.acquire("k1").await;
    let key_id = lease.key_id();
    // The first phase stores the key, then takes its time: the row is written, not committed,
    // when the shutdown gives up, so no release could find it yet.
    let phase = tokio::spawn(async move {
        let slow = Insert { pause: Duration::from_millis(300), ..Insert::order(key_id) };
        slow.run(&mut lease).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.engine.release_held("stopping").await;
    // The process exits when `release_held` returns: by then the phase has committed and given
    // its lease back.
    assert!(phase.is_finished(), "release_held returned while a new key was on its way");
    assert!(matches!(phase.await.unwrap(), Err(Interrupted::LeaseLost)));
    let free: (bool, String) = sqlx::query_as(
        "SELECT owner_token IS NULL AND locked_until IS NULL, recovery_point \
         FROM idempotency_keys WHERE idempotency_key = 'k1'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(free, (true, "order_created".to_owned()), "k1 must be free at its recovery point");
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_shutdown_gives_back_held_leases_and_any_granted_after_it(pool: PgPool) {
    let h = harness(pool).await;
    let mut held = h.acquire("k1").await;
    held.renew().await.unwrap();
    // A new key, not stored yet: nothing to give back now.
    let unstored = h.acquire("k2").await;
    assert_eq!(h.engine.release_held("stopping").await, 1);
    // The holder that was still running loses its next fenced commit.
    assert!(matches!(h.run(held).await, Err(Interrupted::LeaseLost)));

    // A new key whose first phase had not started: the stopping process stores nothing, so no
    // lease can be granted to it after the release looked.
    assert!(matches!(h.run(unstored).await, Err(Interrupted::LeaseLost)));
    let k2: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k2'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(k2, 0);
    assert_eq!(h.events.count(Event::Released), 1);
    // A claim after the shutdown takes nothing, and stores nothing.
    assert!(matches!(h.claim("k3").await, Claim::InUse));
    let k3: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k3'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(k3, 0);

    // Another process (a fresh engine) resumes both at once.
    let other = Engine::new(h.pool.clone(), EngineConfig::default(), h.events.clone());
    for k in ["k1", "k2"] {
        let key = key(k);
        let body = json!({"item": "book"});
        match other.claim(&order_claim("acct_1", &key, &body)).await.unwrap() {
            Claim::Acquired(lease) => drive(&mut h.operation(), lease).await.unwrap(),
            claim => panic!("{k}: expected to resume it, got {claim:?}"),
        };
    }
    assert_eq!(h.orders().await, 2);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_shutdown_waits_for_a_takeover_on_its_way_and_leaves_the_key_free(pool: PgPool) {
    let h = Arc::new(harness(pool).await);
    let mut first = h.acquire("k1").await;
    first.renew().await.unwrap();
    first.release("let go").await;
    // Another transaction holds the key's row, so a retry's takeover waits behind it: the
    // database grants that lease only after the shutdown below has looked.
    let mut blocker = h.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idempotency_keys WHERE idempotency_key = 'k1' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let claim = tokio::spawn({
        let h = h.clone();
        async move { h.claim("k1").await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let unblock = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        blocker.commit().await.unwrap();
    });
    h.engine.release_held("stopping").await;
    // The process exits when `release_held` returns: by then the takeover has committed and
    // given its lease back.
    assert!(claim.is_finished(), "release_held returned while a takeover was on its way");
    assert!(matches!(claim.await.unwrap(), Claim::InUse));
    unblock.await.unwrap();

    // Another process resumes the key at once: its lease was given back, not left to run out.
    let other = Engine::new(h.pool.clone(), EngineConfig::default(), h.events.clone());
    let key = key("k1");
    let body = json!({"item": "book"});
    match other.claim(&order_claim("acct_1", &key, &body)).await.unwrap() {
        Claim::Acquired(lease) => drive(&mut h.operation(), lease).await.unwrap(),
        claim => panic!("expected to resume the key, got {claim:?}"),
    };
    assert_eq!(h.orders().await, 1);
}
