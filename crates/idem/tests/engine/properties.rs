//! Random interleavings of requests, crashes, stalls, outages and completer runs on one key.
//! The model: a key has either no stored answer or exactly one, which never changes; the shipper
//! saw at most one shipment for it; and once every lease has run out and the completer has had its
//! turn, the key is finished with exactly one shipment.

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem::{Claim, Operation};
use sqlx::PgPool;

use crate::helpers::{ORDERS_PLACE, Point, harness};

#[derive(Debug, Clone, Copy)]
enum Action {
    /// A client request: claim and drive to the end (or to a transient failure).
    Request,
    /// A process claims the key, runs this many steps, and dies holding the lease.
    CrashAfter(u8),
    /// Time passes: any lease runs out.
    ExpireLease,
    /// The shipper fails its next call.
    ShipperFails,
    /// The completer takes what is due and drives it.
    Completer,
}

fn action() -> impl proptest::strategy::Strategy<Value = Action> {
    use proptest::prelude::*;
    prop_oneof![
        3 => Just(Action::Request),
        3 => (0u8..3).prop_map(Action::CrashAfter),
        2 => Just(Action::ExpireLease),
        1 => Just(Action::ShipperFails),
        2 => Just(Action::Completer),
    ]
}

#[sqlx::test(migrations = "../../migrations")]
async fn random_interleavings_keep_one_answer_and_one_shipment_per_key(pool: PgPool) {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let h = harness(pool).await;
    let seed = std::env::var("PROOF_SEED").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or(7);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = proptest::collection::vec(action(), 1..12);

    for case in 0..48 {
        let actions = strategy.new_tree(&mut runner).unwrap().current();
        let key = format!("case-{case}");
        let shipments_before = h.shipper.shipments_made();
        let mut answer: Option<(u16, Vec<u8>)> = None;
        for action in &actions {
            match action {
                Action::Request => {
                    if let Claim::Acquired(lease) = h.claim(&key).await {
                        let _ = h.run(lease).await;
                    }
                }
                Action::CrashAfter(steps) => {
                    if let Claim::Acquired(mut lease) = h.claim(&key).await {
                        let mut op = h.operation();
                        for _ in 0..*steps {
                            let Ok(at) = lease.point::<Point>() else { break };
                            if lease.finished().is_some() || op.step(&mut lease, at).await.is_err()
                            {
                                break;
                            }
                        }
                        drop(lease);
                    }
                }
                Action::ExpireLease => h.expire_lease(&key).await,
                Action::ShipperFails => {
                    h.shipper.failures.fetch_add(1, Ordering::SeqCst);
                }
                Action::Completer => {
                    sqlx::query("UPDATE idempotency_keys SET next_attempt_at = now()")
                        .execute(&h.pool)
                        .await
                        .unwrap();
                    for due in h
                        .engine
                        .take_due(10, 1000, Duration::from_secs(3600), &[ORDERS_PLACE])
                        .await
                        .unwrap()
                    {
                        if let idem::Due::Lease(lease) = due {
                            let _ = h.run(lease).await;
                        }
                    }
                }
            }
            // After every action (looked at without taking the lease): at most one answer,
            // and it never changes.
            let stored: Option<(i16, Vec<u8>)> = sqlx::query_as(
                "SELECT response_status, response_body FROM idempotency_keys \
                 WHERE idempotency_key = $1 AND response_status IS NOT NULL",
            )
            .bind(&key)
            .fetch_optional(&h.pool)
            .await
            .unwrap();
            if let Some((status, body)) = stored {
                let stored = (status as u16, body);
                match &answer {
                    None => answer = Some(stored),
                    Some(first) => assert_eq!(first, &stored, "{actions:?}"),
                }
            }
            assert!(h.shipper.shipments_made() - shipments_before <= 1, "{actions:?}");
        }
        // Let time pass and the completer finish whatever is left.
        h.shipper.failures.store(0, Ordering::SeqCst);
        h.expire_lease(&key).await;
        sqlx::query("UPDATE idempotency_keys SET next_attempt_at = now()")
            .execute(&h.pool)
            .await
            .unwrap();
        for due in
            h.engine.take_due(10, 1000, Duration::from_secs(3600), &[ORDERS_PLACE]).await.unwrap()
        {
            if let idem::Due::Lease(lease) = due {
                h.run(lease).await.unwrap();
            }
        }
        if let Claim::Acquired(lease) = h.claim(&key).await {
            h.run(lease).await.unwrap();
        }
        match h.claim(&key).await {
            Claim::Replay(stored) => {
                if let Some(first) = &answer {
                    assert_eq!(first, &(stored.status, stored.body), "{actions:?}");
                }
            }
            other => panic!("key {key} is not finished after {actions:?}: {other:?}"),
        }
        assert_eq!(h.shipper.shipments_made() - shipments_before, 1, "{actions:?}");
    }
}
