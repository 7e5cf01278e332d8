//! Resumption, takeover and fencing: a phase commits whole or not at all, a holder that lost its
//! lease commits nothing, and a key left at any point resumes from it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::{
    Claim, EngineConfig, Event, Interrupted, Lease, Operation, RecoveryPoint, StoredResponse, drive,
};
use sqlx::PgPool;

use crate::helpers::{Insert, Outcome, Point, harness, key, order_claim};

#[sqlx::test(migrations = "../../migrations")]
async fn a_key_abandoned_at_every_recovery_point_resumes_and_ships_once(pool: PgPool) {
    let h = harness(pool).await;
    for (n, stop_at) in
        [Point::Started, Point::OrderCreated, Point::Shipped].into_iter().enumerate()
    {
        let key_value = format!("k{n}");
        // Run phases until the key is at `stop_at`, then walk away holding the lease.
        let mut lease = h.acquire(&key_value).await;
        let mut op = h.operation();
        while lease.point::<Point>().unwrap() != stop_at {
            let at = lease.point::<Point>().unwrap();
            op.step(&mut lease, at).await.unwrap();
        }
        // A new key is stored by its first phase; one left at `started` was stored by a check
        // before a foreign call.
        lease.renew().await.unwrap();
        drop(lease);
        assert_eq!(h.recovery_point(&key_value).await, stop_at.name());

        // Nobody can take it while the lease lives; once it expires, a retry finishes it.
        assert!(matches!(h.claim(&key_value).await, Claim::InUse));
        h.expire_lease(&key_value).await;
        let lease = h.acquire(&key_value).await;
        assert_eq!(lease.point::<Point>().unwrap(), stop_at);
        let response = h.run(lease).await.unwrap();
        assert_eq!(response.status, 201);
        assert!(matches!(h.claim(&key_value).await, Claim::Replay(r) if r == response));
    }
    assert_eq!(h.orders().await, 3);
    assert_eq!(h.shipper.shipments_made(), 3, "one shipment per key, however often it was resumed");
    assert_eq!(h.events.count(Event::TookOver), 3);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_late_commit_by_a_holder_that_lost_its_lease_is_rejected_and_leaves_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let mut slow = h.acquire("k1").await;
    slow.renew().await.unwrap();
    h.expire_lease("k1").await;
    let fast = h.acquire("k1").await;

    // The slow holder wakes up and tries to commit its phase.
    let late = Insert { shipment: Some("late"), ..Insert::order(1) }.run(&mut slow).await;
    assert!(matches!(late, Err(Interrupted::LeaseLost)));
    assert_eq!(h.orders().await, 0, "the fenced phase rolled back its own writes");
    assert_eq!(h.recovery_point("k1").await, "started");
    assert_eq!(h.events.count(Event::LeaseLost), 1);

    // A lost holder cannot release the new holder's lease either.
    slow.release("late").await;
    assert!(matches!(h.claim("k1").await, Claim::InUse));

    h.run(fast).await.unwrap();
    assert_eq!(h.orders().await, 1);
}

/// A phase holds its key from its first statement: a holder whose lease runs out while its phase
/// waits (for another lock, say) is not taken over meanwhile. The retry waits for the phase, then
/// replays the answer the phase stored, and the holder's commit stands.
#[sqlx::test(migrations = "../../migrations")]
async fn a_phase_that_outlives_its_lease_is_not_taken_over(pool: PgPool) {
    let h = harness(pool).await;
    let mut lease = h.acquire("k1").await;
    lease.renew().await.unwrap();
    // The lease ran out before the phase began (a call that took the whole lease); a phase
    // that waits for a lock past it is the same to a retry.
    h.expire_lease("k1").await;
    let key_id = lease.key_id();
    let mut tx = lease.begin().await.unwrap();
    let engine = h.engine.clone();
    let retry = tokio::spawn(async move {
        let request = order_claim("acct_1", &key("k1"), &serde_json::json!({"item": "book"}));
        engine.claim(&request).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!retry.is_finished(), "the retry waits for the phase instead of taking the key over");

    sqlx::query("INSERT INTO orders (key_id) VALUES ($1)")
        .bind(key_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    let answer = StoredResponse::json(201, b"{\"placed\":true}".to_vec());
    tx.commit_answer(answer.clone()).await.expect("the holder's phase commits");
    assert!(matches!(retry.await.unwrap(), Claim::Replay(stored) if stored == answer));
    assert_eq!(h.events.count(Event::TookOver), 0);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_phase_that_errors_rolls_back_completely_and_the_next_attempt_resumes(pool: PgPool) {
    let h = harness(pool).await;
    let mut lease = h.acquire("k1").await;
    let failed = Insert { outcome: Outcome::Fail, ..Insert::order(1) }.run(&mut lease).await;
    assert!(matches!(failed, Err(Interrupted::Transient { .. })));
    assert_eq!(h.orders().await, 0);
    assert_eq!(lease.point::<Point>().unwrap(), Point::Started);
    lease.release("something broke").await;

    let lease = h.acquire("k1").await;
    assert_eq!(lease.point::<Point>().unwrap(), Point::Started);
    h.run(lease).await.unwrap();
    assert_eq!(h.orders().await, 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_operation_dropped_mid_phase_leaves_the_key_resumable(pool: PgPool) {
    let h = harness(pool).await;
    // Dropped inside a transaction, after a write and before the commit.
    let mut lease = h.acquire("k1").await;
    let stuck = Insert { outcome: Outcome::Hang, ..Insert::order(1) }.run(&mut lease);
    assert!(tokio::time::timeout(Duration::from_millis(200), stuck).await.is_err());
    drop(lease);
    assert_eq!(h.orders().await, 0, "the open transaction was rolled back");

    // Dropped during the foreign call.
    h.expire_lease("k1").await;
    h.shipper.hang.store(true, Ordering::SeqCst);
    let lease = h.acquire("k1").await;
    assert!(tokio::time::timeout(Duration::from_millis(300), h.run(lease)).await.is_err());
    assert_eq!(h.recovery_point("k1").await, "order_created");

    h.shipper.hang.store(false, Ordering::SeqCst);
    h.expire_lease("k1").await;
    let response = h.run(h.acquire("k1").await).await.unwrap();
    assert_eq!(response.status, 201);
    assert_eq!(h.orders().await, 1);
    assert_eq!(h.shipper.shipments_made(), 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn serialization_failures_are_retried_not_surfaced(pool: PgPool) {
    let h = harness(pool).await;
    let lease = h.acquire("k1").await;
    let runs = AtomicUsize::new(0);
    let answer = drive(&mut Flaky { runs: &runs }, lease).await.unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(h.recovery_point("k1").await, "finished");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(h.events.count(Event::DatabaseRetry), 2, "both SQLSTATEs were retried");
    assert_eq!(h.orders().await, 1, "the failed tries left nothing behind");
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_unknown_recovery_point_is_an_error_not_a_guess(pool: PgPool) {
    let h = harness(pool).await;
    h.shipper.failures.store(1, Ordering::SeqCst);
    h.run(h.acquire("k1").await).await.unwrap_err();
    let orders_before = h.orders().await;
    sqlx::query("UPDATE idempotency_keys SET recovery_point = 'teleported'")
        .execute(&h.pool)
        .await
        .unwrap();
    let lease = h.acquire("k1").await;
    assert!(lease.point::<Point>().is_err());
    let err = h.run(lease).await.unwrap_err();
    assert!(err.to_string().contains("teleported"), "{err}");
    assert_eq!(h.recovery_point("k1").await, "teleported", "nothing was changed");
    assert_eq!(h.orders().await, orders_before);
    assert_eq!(
        h.shipper.calls.load(Ordering::SeqCst),
        1,
        "no foreign call after the unknown point"
    );
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_release_schedules_the_next_attempt_with_backoff(pool: PgPool) {
    let h = harness(pool).await;
    h.shipper.failures.store(2, Ordering::SeqCst);
    h.run(h.acquire("k1").await).await.unwrap_err();
    h.run(h.acquire("k1").await).await.unwrap_err();
    let (delay_ms, error): (f64, String) = sqlx::query_as(
        "SELECT (extract(epoch FROM next_attempt_at - now()) * 1000)::float8, last_error FROM idempotency_keys",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    // Two attempts: base 1 s doubled once.
    assert!((1500.0..=2000.0).contains(&delay_ms), "{delay_ms}");
    assert_eq!(error, "shipper unavailable");
}

#[test]
fn the_lease_must_outlive_the_longest_foreign_call() {
    let config = EngineConfig { lease: Duration::from_secs(10), ..EngineConfig::default() };
    assert!(config.check_lease_covers(Duration::from_secs(5)).is_ok());
    assert!(config.check_lease_covers(Duration::from_millis(5001)).is_err());
}

/// The margin covers the last phase's tries before its general phase holds the key: a batch, the
/// statement alone, and a pooled connection within the default acquire timeout (2 s).
#[test]
fn the_lease_margin_covers_the_one_statement_tries_of_a_last_phase() {
    let tries = idem::batch::DEADLINE + idem::batch::ANSWER_GRACE + idem::ONE_STATEMENT_TIMEOUT;
    assert!(tries + Duration::from_secs(2) <= EngineConfig::LEASE_MARGIN, "{tries:?}");
}

/// An operation of one phase that inserts an order; its first run fails as a serialization
/// failure would, its second as a deadlock would: real errors from Postgres with those SQLSTATEs,
/// which `drive` answers by running the step again.
struct Flaky<'a> {
    runs: &'a AtomicUsize,
}

impl Operation for Flaky<'_> {
    type Point = Point;

    async fn step(&mut self, lease: &mut Lease, _at: Point) -> Result<(), Interrupted> {
        let mut tx = lease.begin().await?;
        sqlx::query("INSERT INTO orders (key_id) VALUES (1)").execute(&mut *tx).await?;
        let code = match self.runs.fetch_add(1, Ordering::SeqCst) {
            0 => Some("40001"),
            1 => Some("40P01"),
            _ => None,
        };
        if let Some(code) = code {
            let raise =
                format!("DO $$ BEGIN RAISE EXCEPTION 'simulated' USING ERRCODE = '{code}'; END $$");
            sqlx::query(&raise).execute(&mut *tx).await?;
        }
        tx.commit_answer(StoredResponse::json(201, b"{}".to_vec())).await
    }
}

/// An operation whose first phase fails after a write.
struct FailingFirstPhase;

impl Operation for FailingFirstPhase {
    type Point = Point;

    async fn step(&mut self, lease: &mut Lease, _at: Point) -> Result<(), Interrupted> {
        Insert { outcome: Outcome::Fail, ..Insert::order(lease.key_id()) }.run(lease).await
    }
}

/// A new key was never stored, so it is not there to give back: its first phase's failure is
/// answered as that failure, not as a lease lost to someone else (which a client is told to wait
/// out and retry, for ever if the failure repeats).
#[sqlx::test(migrations = "../../migrations")]
async fn a_new_key_whose_first_phase_fails_is_that_failure_not_a_lost_lease(pool: PgPool) {
    let h = harness(pool).await;
    let lease = h.acquire("k1").await;
    let failed = drive(&mut FailingFirstPhase, lease).await;
    assert!(matches!(failed, Err(Interrupted::Transient { .. })), "{failed:?}");
    assert_eq!(h.orders().await, 0);
    assert_eq!(h.events.count(Event::LeaseLost), 0);
}
