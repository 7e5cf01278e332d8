//! One test per claim outcome: a new key, a replay, a mismatch, a key in use, one flagged for a
//! person, and the race of many requests for one key.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use idem::{Claim, Event, Interrupted, Operation, Read, TransientKind};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Point, harness, key, order_claim};

#[sqlx::test(migrations = "../../migrations")]
async fn a_new_key_is_acquired_at_started(pool: PgPool) {
    let h = harness(pool).await;
    let lease = h.acquire("k1").await;
    assert_eq!(lease.point::<Point>().unwrap(), Point::Started);
    assert_eq!(lease.attempts(), 1);
    assert_eq!(lease.params(), &json!({"item": "book"}));
    assert_eq!(h.events.count(Event::Claimed), 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_claim_checks_the_credential_it_is_given_in_the_same_statement(pool: PgPool) {
    let h = harness(pool).await;
    sqlx::raw_sql(
        "INSERT INTO accounts (id, name) VALUES ('acct_1', 'one'), ('acct_2', 'two'); \
         INSERT INTO api_keys (id, account_id, key_hash, last4, revoked_at) VALUES \
           ('key_live', 'acct_1', decode(repeat('aa', 32), 'hex'), 'aaaa', NULL), \
           ('key_other', 'acct_2', decode(repeat('bb', 32), 'hex'), 'bbbb', NULL), \
           ('key_revoked', 'acct_1', decode(repeat('cc', 32), 'hex'), 'cccc', now())",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    let (live, other, revoked, unknown) = ([0xaa; 32], [0xbb; 32], [0xcc; 32], [0xdd; 32]);

    // A dead credential claims nothing: no key row appears.
    for dead in [&other, &revoked, &unknown] {
        assert!(matches!(h.claim_with_credential("k1", dead).await, Claim::Unauthenticated));
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);

    // A live one claims; once the key is finished, a dead one cannot read its answer.
    let Claim::Acquired(lease) = h.claim_with_credential("k1", &live).await else {
        panic!("a live credential claims the key")
    };
    let first = h.run(lease).await.unwrap();
    assert!(matches!(h.claim_with_credential("k1", &revoked).await, Claim::Unauthenticated));
    assert!(matches!(h.claim_with_credential("k1", &other).await, Claim::Unauthenticated));
    match h.claim_with_credential("k1", &live).await {
        Claim::Replay(replayed) => assert_eq!(replayed, first),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// A claim in two halves, as the API makes it: the read decides a replay or a refusal on its own
/// and writes nothing; a key it finds open is taken by `take`, which answers `None` when another
/// request took the key between the read and the take.
#[sqlx::test(migrations = "../../migrations")]
async fn a_claims_read_decides_alone_and_its_take_can_miss(pool: PgPool) {
    let h = harness(pool).await;
    let (body, keys) = (json!({"item": "book"}), ["done", "stalled"].map(key));
    let [done, stalled] = keys.each_ref().map(|key| order_claim("acct_1", key, &body));
    let first = h.run(h.acquire("done").await).await.unwrap();
    match h.engine.read_claim(&done).await.unwrap() {
        Read::Decided(Claim::Replay(replayed)) => assert_eq!(replayed, first),
        other => panic!("expected a replay, got {other:?}"),
    }

    // An unfinished key whose holder's lease ran out: two requests read it open.
    let mut lease = h.acquire("stalled").await;
    h.operation().step(&mut lease, Point::Started).await.unwrap();
    h.expire_lease("stalled").await;
    let Read::Open(one) = h.engine.read_claim(&stalled).await.unwrap() else { panic!("open") };
    let Read::Open(other) = h.engine.read_claim(&stalled).await.unwrap() else { panic!("open") };
    let taken = h.engine.take(one, &stalled).await.unwrap();
    assert!(matches!(taken, Some(Claim::Acquired(_))), "{taken:?}");
    let missed = h.engine.take(other, &stalled).await.unwrap();
    assert!(missed.is_none(), "the second take missed: {missed:?}");
    assert!(matches!(h.engine.claim(&stalled).await.unwrap(), Claim::InUse));
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_finished_key_replays_the_stored_response_and_runs_nothing(pool: PgPool) {
    let h = harness(pool).await;
    let first = h.run(h.acquire("k1").await).await.unwrap();
    let calls = h.shipper.calls.load(Ordering::SeqCst);
    match h.claim("k1").await {
        Claim::Replay(replayed) => assert_eq!(replayed, first),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(first.status, 201);
    assert_eq!(first.header("location").unwrap(), "/orders/1");
    assert_eq!(h.shipper.calls.load(Ordering::SeqCst), calls);
    assert_eq!(h.events.count(Event::Replayed), 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_different_request_with_the_key_is_a_mismatch_and_leaves_the_record(pool: PgPool) {
    let h = harness(pool).await;
    let first = h.run(h.acquire("k1").await).await.unwrap();
    match h.claim_as("acct_1", "k1", &json!({"item": "pen"})).await {
        Claim::Mismatch { method, path } => {
            assert_eq!((method.as_str(), path.as_str()), ("POST", "/orders"))
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    match h.claim("k1").await {
        Claim::Replay(replayed) => assert_eq!(replayed, first),
        other => panic!("the original record must be untouched, got {other:?}"),
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_key_held_by_a_live_lease_is_in_use(pool: PgPool) {
    let h = harness(pool).await;
    let mut held = h.acquire("k1").await;
    held.renew().await.unwrap();
    assert!(matches!(h.claim("k1").await, Claim::InUse));
    assert_eq!(h.events.count(Event::InUse), 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_new_key_is_stored_only_by_its_first_phase_and_a_duplicate_meanwhile_stores_nothing(
    pool: PgPool,
) {
    let h = harness(pool).await;
    let mut first = h.acquire("k1").await;
    let rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idempotency_keys")
            .fetch_one(&h.pool)
            .await
            .unwrap()
    };
    assert_eq!(rows().await, 0, "the claim of a new key writes nothing");

    // A second request with the key, and one with another body, read nothing either.
    let second = h.acquire("k1").await;
    let other = match h.claim_as("acct_1", "k1", &json!({"item": "pen"})).await {
        Claim::Acquired(lease) => lease,
        other => panic!("expected to acquire the unstored key, got {other:?}"),
    };

    // The first phase to commit stores the key with its writes.
    let mut op = h.operation();
    op.step(&mut first, Point::Started).await.unwrap();
    assert_eq!(rows().await, 1);
    assert_eq!(h.recovery_point("k1").await, "order_created");

    // The others' first phases meet the stored key on the unique index and roll back whole.
    assert!(matches!(h.run(second).await, Err(Interrupted::Superseded)));
    assert!(matches!(h.run(other).await, Err(Interrupted::Superseded)));
    assert_eq!(h.orders().await, 1, "the losers' writes were rolled back");
    // Claimed again, as the API does: in use for the same request, a mismatch for another.
    assert!(matches!(h.claim("k1").await, Claim::InUse));
    assert!(matches!(
        h.claim_as("acct_1", "k1", &json!({"item": "pen"})).await,
        Claim::Mismatch { .. }
    ));

    h.run(first).await.unwrap();
    assert_eq!(h.shipper.shipments_made(), 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_check_before_a_foreign_call_stores_a_new_key_first(pool: PgPool) {
    let h = harness(pool).await;
    let mut lease = h.acquire("k1").await;
    let duplicate = h.acquire("k1").await;
    assert_eq!(lease.before_call().await.unwrap(), None);
    assert_eq!(h.recovery_point("k1").await, "started");
    assert!(matches!(h.claim("k1").await, Claim::InUse));
    // The duplicate that read before the key was stored cannot store it again.
    let mut duplicate = duplicate;
    assert!(matches!(duplicate.renew().await, Err(Interrupted::Superseded)));
    h.run(lease).await.unwrap();
    assert_eq!(h.orders().await, 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_released_key_is_resumed_from_its_recovery_point(pool: PgPool) {
    let h = harness(pool).await;
    h.shipper.failures.store(1, Ordering::SeqCst);
    let err = h.run(h.acquire("k1").await).await.unwrap_err();
    assert!(matches!(err, Interrupted::Transient { kind: TransientKind::Processor, .. }));
    assert_eq!(h.recovery_point("k1").await, "order_created");

    let lease = h.acquire("k1").await;
    assert_eq!(lease.point::<Point>().unwrap(), Point::OrderCreated);
    assert_eq!(lease.attempts(), 2);
    h.run(lease).await.unwrap();
    assert_eq!(h.events.count(Event::Resumed), 1);
    assert_eq!(h.orders().await, 1);
    assert_eq!(h.shipper.shipments_made(), 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_key_flagged_for_a_person_is_never_resumed(pool: PgPool) {
    let h = harness(pool).await;
    h.shipper.failures.store(1, Ordering::SeqCst);
    h.run(h.acquire("k1").await).await.unwrap_err();
    sqlx::query("UPDATE idempotency_keys SET needs_human_at = now()")
        .execute(&h.pool)
        .await
        .unwrap();
    assert!(matches!(h.claim("k1").await, Claim::NeedsHuman));
}

#[sqlx::test(migrations = "../../migrations")]
async fn the_same_key_in_two_accounts_names_two_operations(pool: PgPool) {
    let h = harness(pool).await;
    let body = json!({"item": "book"});
    assert!(matches!(h.claim_as("acct_1", "k1", &body).await, Claim::Acquired(_)));
    assert!(matches!(h.claim_as("acct_2", "k1", &body).await, Claim::Acquired(_)));
}

#[sqlx::test(migrations = "../../migrations")]
async fn fifty_concurrent_requests_of_one_key_yield_exactly_one_holder(pool: PgPool) {
    let h = Arc::new(harness(pool).await);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            match h.claim("storm").await {
                Claim::Acquired(lease) => Ok(h.run(lease).await),
                other => Err(other),
            }
        }));
    }
    let (mut finished, mut superseded, mut in_use, mut replayed) = (0, 0, 0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(Ok(_)) => finished += 1,
            Ok(Err(Interrupted::Superseded)) => superseded += 1,
            Err(Claim::InUse) => in_use += 1,
            Err(Claim::Replay(_)) => replayed += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(finished, 1, "{superseded} superseded, {in_use} in use, {replayed} replayed");
    assert_eq!(superseded + in_use + replayed, 49);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(h.orders().await, 1);
    assert_eq!(h.shipper.shipments_made(), 1);
}
