//! The completer: its give-up bound counts its own attempts only, a flag that fails or matches no
//! lease costs nothing else, and a key woken while held is due at once when released.

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem::{Claim, Event, Interrupted, Lease, Operation};
use sqlx::PgPool;

use crate::helpers::{Harness, Insert, ORDERS_PLACE, Point, harness};

/// The completer flags a key that ran out of attempts; when that flag fails, the other keys the
/// same statement leased are still handed out, not dropped with a lease nobody holds.
#[sqlx::test(migrations = "../../migrations")]
async fn a_flag_that_fails_costs_the_completer_only_that_key(pool: PgPool) {
    let h = harness(pool).await;
    for key_value in ["spent", "due"] {
        let mut lease = h.acquire(key_value).await;
        h.operation().step(&mut lease, Point::Started).await.unwrap();
        drop(lease);
        h.expire_lease(key_value).await;
    }
    sqlx::query(
        "UPDATE idempotency_keys SET next_attempt_at = now() - interval '1 second', \
         completer_attempts = CASE idempotency_key WHEN 'spent' THEN 50 ELSE 0 END",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    // Any flag of `spent` fails, as a lost connection or a full disk would make it.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_flag() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'no flag today'; END $$; \
         CREATE TRIGGER refuse_flag BEFORE UPDATE ON idempotency_keys FOR EACH ROW \
         WHEN (OLD.idempotency_key = 'spent' AND NEW.needs_human_at IS NOT NULL) \
         EXECUTE FUNCTION refuse_flag();",
    )
    .execute(&h.pool)
    .await
    .unwrap();

    let due = h.engine.take_due(10, 10, Duration::from_secs(3600), &[ORDERS_PLACE]).await.unwrap();
    let leases: Vec<Lease> = due
        .into_iter()
        .filter_map(|due| match due {
            idem::Due::Lease(lease) => Some(lease),
            idem::Due::Flagged { .. } => None,
        })
        .collect();
    assert_eq!(leases.len(), 1, "the key that is due is handed out");
    let response = h.run(leases.into_iter().next().unwrap()).await.unwrap();
    assert_eq!(response.status, 201);
    assert!(matches!(h.claim("due").await, Claim::Replay(_)));
    // The one whose flag failed is neither flagged nor finished: its lease runs out and the
    // completer flags it again.
    let flagged: bool = sqlx::query_scalar(
        "SELECT needs_human_at IS NOT NULL FROM idempotency_keys WHERE idempotency_key = 'spent'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!(!flagged);
}

/// The completer's attempt bound in these tests.
const MAX_ATTEMPTS: u32 = 3;

impl Harness {
    /// Makes every unfinished key due for the completer now (its back-off is not under test).
    async fn make_due(&self) {
        sqlx::query(
            "UPDATE idempotency_keys SET next_attempt_at = now() - interval '1 second' \
             WHERE completed_at IS NULL",
        )
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// One completer take, at the attempt bound `MAX_ATTEMPTS`.
    async fn take_one_due(&self) -> idem::Due {
        let mut due = self
            .engine
            .take_due(1, MAX_ATTEMPTS, Duration::from_secs(3600), &[ORDERS_PLACE])
            .await
            .unwrap();
        assert_eq!(due.len(), 1, "{due:?}");
        due.pop().unwrap()
    }

    /// `attempts`, `completer_attempts` and whether the key is flagged.
    async fn attempt_counts(&self, key_value: &str) -> (i32, i32, bool) {
        sqlx::query_as(
            "SELECT attempts, completer_attempts, needs_human_at IS NOT NULL \
               FROM idempotency_keys WHERE idempotency_key = $1",
        )
        .bind(key_value)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

/// A client that retries a key through an outage, more often than the completer's bound, spends
/// none of the completer's attempts: once the shipper is back, the completer drives the key to its
/// answer instead of flagging it for a person on first sight. Every attempt is still on record.
#[sqlx::test(migrations = "../../migrations")]
async fn client_retries_do_not_spend_the_completers_attempts(pool: PgPool) {
    let h = harness(pool).await;
    let retries = MAX_ATTEMPTS as usize + 1;
    h.shipper.failures.store(1 + retries, Ordering::SeqCst);
    // The claim, then `max_attempts + 1` client retries, each resuming the released key through
    // the claim and failing again.
    let err = h.run(h.acquire("k1").await).await.unwrap_err();
    assert!(matches!(err, Interrupted::Transient { .. }), "{err:?}");
    for _ in 0..retries {
        let err = h.run(h.acquire("k1").await).await.unwrap_err();
        assert!(matches!(err, Interrupted::Transient { .. }), "{err:?}");
    }
    let client_attempts = 1 + retries as i32;
    assert_eq!(h.attempt_counts("k1").await, (client_attempts, 0, false));

    // The shipper is back; the client stopped; the completer's turn comes.
    h.make_due().await;
    let lease = match h.take_one_due().await {
        idem::Due::Lease(lease) => lease,
        idem::Due::Flagged { reason, .. } => panic!("flagged on first sight: {reason}"),
    };
    assert_eq!(lease.attempts(), client_attempts + 1, "every attempt counts for the record");
    assert_eq!(h.run(lease).await.unwrap().status, 201);
    assert_eq!(h.attempt_counts("k1").await, (client_attempts + 1, 1, false));
    assert_eq!(h.events.count(Event::Flagged), 0);
    assert_eq!(h.shipper.shipments_made(), 1);
    assert!(matches!(h.claim("k1").await, Claim::Replay(_)));
    let logged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_attempts a JOIN idempotency_keys k ON k.id = a.key_id \
          WHERE k.idempotency_key = 'k1'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(logged, i64::from(client_attempts), "every attempt after the claim is logged");
}

/// A key the completer itself fails on `max_attempts` times is flagged for a person the next time
/// it takes it, client retries in between or not; and a client retry then gets the flag.
#[sqlx::test(migrations = "../../migrations")]
async fn the_completer_gives_up_after_its_own_attempts(pool: PgPool) {
    let h = harness(pool).await;
    h.shipper.failures.store(usize::MAX / 2, Ordering::SeqCst);
    h.run(h.acquire("k1").await).await.unwrap_err();
    for run in 1..=MAX_ATTEMPTS as i32 {
        // A client retry between the completer's runs neither spends nor resets its budget.
        h.run(h.acquire("k1").await).await.unwrap_err();
        h.make_due().await;
        let lease = match h.take_one_due().await {
            idem::Due::Lease(lease) => lease,
            idem::Due::Flagged { reason, .. } => panic!("flagged after {run} runs: {reason}"),
        };
        let err = h.run(lease).await.unwrap_err();
        assert!(matches!(err, Interrupted::Transient { .. }), "{err:?}");
        assert_eq!(h.attempt_counts("k1").await, (1 + 2 * run, run, false));
    }
    h.make_due().await;
    match h.take_one_due().await {
        idem::Due::Flagged { reason, .. } => {
            assert!(reason.contains(&format!("gave up after {MAX_ATTEMPTS} attempts")), "{reason}")
        }
        idem::Due::Lease(lease) => panic!("driven again: {lease:?}"),
    }
    let spent = 1 + 2 * MAX_ATTEMPTS as i32;
    assert_eq!(h.attempt_counts("k1").await, (spent + 1, MAX_ATTEMPTS as i32 + 1, true));
    assert_eq!(h.events.count(Event::Flagged), 1);
    assert!(matches!(h.claim("k1").await, Claim::NeedsHuman));
}

/// A key whose lease runs out between the completer's take and its flag, and which another taker
/// holds by then, is that taker's to drive: the completer neither reports it flagged nor counts
/// it as needing a person.
#[sqlx::test(migrations = "../../migrations")]
async fn a_flag_that_matches_no_lease_reports_nothing(pool: PgPool) {
    let h = harness(pool).await;
    h.shipper.failures.store(1, Ordering::SeqCst);
    h.run(h.acquire("k1").await).await.unwrap_err();
    // The completer's budget is spent: its next take of the key flags it.
    sqlx::query("UPDATE idempotency_keys SET completer_attempts = $1")
        .bind(MAX_ATTEMPTS as i32)
        .execute(&h.pool)
        .await
        .unwrap();
    h.make_due().await;
    // Stands in for the takeover between the take and the flag: the flag's update, fenced on the
    // completer's token, matches no row.
    sqlx::raw_sql(
        "CREATE FUNCTION taken_meanwhile() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RETURN NULL; END $$; \
         CREATE TRIGGER taken_meanwhile BEFORE UPDATE ON idempotency_keys FOR EACH ROW \
         WHEN (OLD.needs_human_at IS NULL AND NEW.needs_human_at IS NOT NULL) \
         EXECUTE FUNCTION taken_meanwhile()",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    let due = h
        .engine
        .take_due(1, MAX_ATTEMPTS, Duration::from_secs(3600), &[ORDERS_PLACE])
        .await
        .unwrap();
    assert!(due.is_empty(), "{due:?}");
    assert_eq!(h.events.count(Event::Flagged), 0);
    assert!(!h.attempt_counts("k1").await.2, "the key is not flagged");
}

/// News that lets a key finish (a processor webhook) can arrive while the key is held, its holder
/// waiting on a call that then fails. The wake leaves the holder alone; the holder's release then
/// makes the key due at once instead of after its back-off, so the news is not lost behind it.
/// A release with no wake since the lease began keeps the back-off.
#[sqlx::test(migrations = "../../migrations")]
async fn a_key_woken_while_held_is_due_at_once_when_its_holder_releases_it(pool: PgPool) {
    let h = harness(pool).await;
    let due_in = |key: &'static str| {
        let pool = h.pool.clone();
        async move {
            let seconds: f64 = sqlx::query_scalar(
                "SELECT extract(epoch FROM next_attempt_at - now())::float8 \
                   FROM idempotency_keys WHERE idempotency_key = $1",
            )
            .bind(key)
            .fetch_one(&pool)
            .await
            .unwrap();
            seconds
        }
    };
    for (key, woken) in [("woken", true), ("quiet", false)] {
        let mut lease = h.acquire(key).await;
        let key_id = lease.key_id();
        Insert::order(key_id).run(&mut lease).await.unwrap();
        if woken {
            // The holder's lease and point are untouched.
            assert!(idem::wake(&h.pool, key_id).await.unwrap(), "unfinished");
            assert_eq!(lease.point::<Point>().unwrap(), Point::OrderCreated);
        }
        lease.release("the call failed").await;
        let due = due_in(key).await;
        if woken {
            assert!(due <= 0.0, "{key}: due in {due} s");
        } else {
            assert!(due > 0.0, "{key}: the back-off is kept, due in {due} s");
        }
    }
    // The completer takes the woken key now and not the other.
    let due = h.engine.take_due(10, 10, Duration::from_secs(3600), &[ORDERS_PLACE]).await.unwrap();
    let taken: Vec<i64> = due
        .iter()
        .map(|d| match d {
            idem::Due::Lease(lease) => lease.key_id(),
            idem::Due::Flagged { key_id, .. } => *key_id,
        })
        .collect();
    let woken_id: i64 =
        sqlx::query_scalar("SELECT id FROM idempotency_keys WHERE idempotency_key = 'woken'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(taken, [woken_id]);
}
