//! One-statement phases (`phase_in_one`, `idem_commit_fence`) and the batches that share one
//! statement between phases that arrive together.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem::batch::{Batch, Batcher};
use idem::{Claim, FenceRecord, Lease, Operation, PhaseError, Step, StoredResponse};
use payments_testkit::{WAIT, eventually};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::helpers::{Harness, Point, harness};

/// A one-statement phase: the operation's statement sets the order's shipment, if there is one,
/// and calls `idem_commit_fence($fence)` beside it, so both commit together or not at all.
async fn ship_in_one(lease: &mut Lease, step: Step<Point>) -> Result<(), PhaseError<String>> {
    lease.phase_in_one(step, async |connection, fence| ship(connection, fence).await).await
}

/// The statement of [`ship_in_one`].
async fn ship(
    connection: &mut PgConnection,
    fence: &FenceRecord,
) -> Result<(i64, ()), PhaseError<String>> {
    let key_id = sqlx::query_scalar(
        "WITH fence AS (SELECT idem_commit_fence($1) AS key_id), \
              shipped AS (UPDATE orders SET shipment = 'in one' FROM fence \
                           WHERE orders.key_id = fence.key_id) \
         SELECT key_id FROM fence",
    )
    .bind(fence)
    .fetch_one(connection)
    .await?;
    Ok((key_id, ()))
}

/// A stored key moved by one-statement phases (`idem_commit_fence`, which calls the typed moves
/// a phase of several statements uses): to the next point, then finished; and a holder that lost
/// its lease commits neither the move nor the statement's own write.
#[sqlx::test(migrations = "../../migrations")]
async fn one_statement_phases_move_a_stored_key_fenced(pool: PgPool) {
    let h = harness(pool).await;
    let mut lease = h.acquire("single").await;
    h.operation().step(&mut lease, Point::Started).await.unwrap();
    assert_eq!(h.recovery_point("single").await, "order_created");

    ship_in_one(&mut lease, Step::Next(Point::Shipped)).await.unwrap();
    assert_eq!(h.recovery_point("single").await, "shipped");
    assert_eq!(h.shipment("single").await.as_deref(), Some("in one"), "the statement's own write");
    assert_eq!(lease.point::<Point>().unwrap(), Point::Shipped);
    let answer = StoredResponse::json(201, b"{\"shipped\":true}".to_vec());
    ship_in_one(&mut lease, Step::Finish(answer.clone())).await.unwrap();
    assert!(matches!(h.claim("single").await, Claim::Replay(stored) if stored == answer));

    // Another key, whose holder stalls past its lease while a retry takes it over.
    let mut stalled = h.acquire("stalled").await;
    h.operation().step(&mut stalled, Point::Started).await.unwrap();
    h.expire_lease("stalled").await;
    let _taken = h.acquire("stalled").await;
    let late = ship_in_one(&mut stalled, Step::Next(Point::Shipped)).await;
    assert!(matches!(late, Err(PhaseError::LeaseLost)), "{late:?}");
    assert_eq!(h.recovery_point("stalled").await, "order_created");
    let shipment = h.shipment("stalled").await;
    assert_eq!(shipment, None, "the late statement's own write rolled back with its fence");
}

/// Shipments written in batches: one statement for every row, each order's shipment set where
/// its key's fence moved it. Records the size of every batch; with `hold_first`, its first batch
/// waits for `release` before it sends anything; with `hang_first`, its first batch never
/// answers, as on a connection that stopped answering.
#[derive(Default)]
struct Shipments {
    sizes: Mutex<Vec<usize>>,
    hold_first: std::sync::atomic::AtomicBool,
    hang_first: std::sync::atomic::AtomicBool,
    release: tokio::sync::Notify,
}

/// The batch kind of [`Shipments`], which the test keeps a handle on.
struct ShipmentBatch(Arc<Shipments>);

impl Batch for ShipmentBatch {
    type Row = String;

    async fn send(
        &self,
        connection: &mut PgConnection,
        rows: &[(String, FenceRecord)],
    ) -> Result<Vec<Option<i64>>, sqlx::Error> {
        let shipments = &self.0;
        shipments.sizes.lock().unwrap().push(rows.len());
        if shipments.hold_first.swap(false, Ordering::SeqCst) {
            shipments.release.notified().await;
        }
        if shipments.hang_first.swap(false, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let shipments: Vec<&str> = rows.iter().map(|(shipment, _)| shipment.as_str()).collect();
        let fences: Vec<FenceRecord> = rows.iter().map(|(_, fence)| fence.clone()).collect();
        sqlx::query_scalar(
            "WITH input AS (SELECT * FROM unnest($1::text[]) WITH ORDINALITY AS t(shipment, ord)), \
                  fenced AS (SELECT ord, idem_commit_fence(($2::idem_fence[])[ord]) AS key_id \
                               FROM input), \
                  shipped AS (UPDATE orders SET shipment = input.shipment \
                                FROM fenced JOIN input USING (ord) \
                               WHERE orders.key_id = fenced.key_id) \
             SELECT key_id FROM fenced ORDER BY ord",
        )
        .bind(&shipments)
        .bind(&fences)
        .fetch_all(connection)
        .await
    }
}

/// [`ship_in_one`], batched: in a batch it ships "in a batch", alone "in one". Counts the phases
/// that handed the batcher their row.
async fn ship_batched(
    mut lease: Lease,
    batcher: Batcher<ShipmentBatch>,
    handed: Arc<AtomicUsize>,
) -> Result<(), PhaseError<String>> {
    let step = Step::Next(Point::Shipped);
    handed.fetch_add(1, Ordering::SeqCst);
    match lease.phase_in_batch(&step, &batcher, "in a batch".to_owned()).await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(PhaseError::LeaseLost) => return Err(PhaseError::LeaseLost),
        Err(other) => panic!("{other:?}"),
    }
    ship_in_one(&mut lease, step).await
}

/// `count` keys, each with its order created and its lease held, and a batcher of shipments.
async fn ready_to_ship(
    h: &Harness,
    count: usize,
) -> (Vec<(String, Lease)>, Arc<Shipments>, Batcher<ShipmentBatch>) {
    let mut leases = Vec::new();
    for i in 0..count {
        let key = format!("batched-{i}");
        let mut lease = h.acquire(&key).await;
        h.operation().step(&mut lease, Point::Started).await.unwrap();
        leases.push((key, lease));
    }
    let shipments = Arc::new(Shipments::default());
    let batcher = Batcher::new(h.pool.clone(), ShipmentBatch(shipments.clone()));
    (leases, shipments, batcher)
}

/// Phases that reach the batcher while a batch is in flight share the next statement; each key
/// moves and each order is shipped by it, as by one statement each.
#[sqlx::test(migrations = "../../migrations")]
async fn one_statement_phases_that_arrive_together_share_a_batch(pool: PgPool) {
    let h = harness(pool).await;
    let (leases, shipments, batcher) = ready_to_ship(&h, 4).await;
    shipments.hold_first.store(true, Ordering::SeqCst);
    let handed = Arc::new(AtomicUsize::new(0));
    let mut phases = Vec::new();
    for (i, (_, lease)) in leases.into_iter().enumerate() {
        phases.push(tokio::spawn(ship_batched(lease, batcher.clone(), handed.clone())));
        if i == 0 {
            // The first phase's batch is under way (and waits) before the others arrive.
            let first_batch = || async { shipments.sizes.lock().unwrap().len() == 1 };
            eventually("the first batch to be under way", WAIT, first_batch).await;
        }
    }
    let all_handed = || async { handed.load(Ordering::SeqCst) == 4 };
    eventually("every phase to hand the batcher its row", WAIT, all_handed).await;
    shipments.release.notify_one();
    for phase in phases {
        phase.await.unwrap().unwrap();
    }
    assert_eq!(*shipments.sizes.lock().unwrap(), [1, 3], "the three that queued, in one statement");
    for i in 0..4 {
        let key = format!("batched-{i}");
        assert_eq!(h.recovery_point(&key).await, "shipped");
        assert_eq!(h.shipment(&key).await.as_deref(), Some("in a batch"));
    }
}

/// While a batch has been in flight for `STUCK` (waiting for something), a phase that arrives goes
/// alone at once instead of queueing behind it; the batch's own phase finishes when it does.
#[sqlx::test(migrations = "../../migrations")]
async fn a_phase_does_not_queue_behind_a_batch_that_is_stuck(pool: PgPool) {
    let h = harness(pool).await;
    let (leases, shipments, batcher) = ready_to_ship(&h, 2).await;
    shipments.hold_first.store(true, Ordering::SeqCst);
    let handed = Arc::new(AtomicUsize::new(0));
    let mut leases = leases.into_iter();
    let (_, held) = leases.next().unwrap();
    let first = tokio::spawn(ship_batched(held, batcher.clone(), handed.clone()));
    let first_batch = || async { shipments.sizes.lock().unwrap().len() == 1 };
    eventually("the first batch to be under way", WAIT, first_batch).await;
    tokio::time::sleep(idem::batch::STUCK).await;

    let (key, late) = leases.next().unwrap();
    ship_batched(late, batcher.clone(), handed.clone()).await.unwrap();
    assert_eq!(h.shipment(&key).await.as_deref(), Some("in one"), "it went alone");
    assert_eq!(shipments.sizes.lock().unwrap().len(), 1, "no second batch");

    shipments.release.notify_one();
    first.await.unwrap().unwrap();
    assert_eq!(h.shipment("batched-0").await.as_deref(), Some("in a batch"));
}

/// A batch in which one phase lost its lease writes nothing (its fence raises `IL001`), and every
/// phase of it is sent again alone: the others commit, the late one is told its lease was lost
/// and writes nothing.
#[sqlx::test(migrations = "../../migrations")]
async fn a_batch_with_a_lost_lease_sends_its_phases_alone(pool: PgPool) {
    let h = harness(pool).await;
    let (leases, shipments, batcher) = ready_to_ship(&h, 3).await;
    h.expire_lease("batched-1").await;
    let _taken = h.acquire("batched-1").await;
    let handed = Arc::new(AtomicUsize::new(0));
    // Spawned together, on this test's one thread: all three hand their rows over before the
    // batcher's task first runs, so they are one batch.
    let mut phases = Vec::new();
    for (key, lease) in leases {
        let phase = tokio::spawn(ship_batched(lease, batcher.clone(), handed.clone()));
        phases.push((key, phase));
    }
    for (key, phase) in phases {
        let done = phase.await.unwrap();
        if key == "batched-1" {
            assert!(matches!(done, Err(PhaseError::LeaseLost)), "{done:?}");
            assert_eq!(h.recovery_point(&key).await, "order_created");
            assert_eq!(h.shipment(&key).await, None, "the late phase wrote nothing");
        } else {
            done.unwrap();
            assert_eq!(h.recovery_point(&key).await, "shipped");
            assert_eq!(h.shipment(&key).await.as_deref(), Some("in one"), "{key} went alone");
        }
    }
    assert_eq!(*shipments.sizes.lock().unwrap(), [3], "one batch, which failed whole");
}

/// A new key stored by its first phase with a JSON `null` for its frozen call stores no call, as
/// `idem_commit` did: the call is planned again before it is made, never read back as one, by
/// the holder that planned it either.
#[sqlx::test(migrations = "../../migrations")]
async fn a_null_plan_is_stored_as_no_plan(pool: PgPool) {
    let h = harness(pool).await;
    let mut lease = h.acquire("null-plan").await;
    ship_in_one(&mut lease, Step::Call(Point::OrderCreated, Value::Null)).await.unwrap();
    assert_eq!(h.recovery_point("null-plan").await, "order_created");
    let plan: Option<Value> = sqlx::query_scalar(
        "SELECT planned_call FROM idempotency_keys WHERE idempotency_key = 'null-plan'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(plan, None);
    // The holder that planned it sees what a resumed holder would read: no plan.
    assert_eq!(lease.before_call().await.unwrap(), None);
}

/// A batch whose connection stops answering is given up at the batcher's deadline: its phase
/// goes alone instead of waiting for ever, and the next phase is batched again, on a new
/// connection.
#[sqlx::test(migrations = "../../migrations")]
async fn a_batch_that_never_answers_is_given_up_and_batching_resumes(pool: PgPool) {
    let h = harness(pool).await;
    let (leases, shipments, _) = ready_to_ship(&h, 2).await;
    let deadline = std::time::Duration::from_millis(200);
    let batcher =
        Batcher::with_deadline(h.pool.clone(), ShipmentBatch(shipments.clone()), deadline);
    shipments.hang_first.store(true, Ordering::SeqCst);
    let handed = Arc::new(AtomicUsize::new(0));
    let mut leases = leases.into_iter();

    let (key, hung) = leases.next().unwrap();
    let alone = tokio::time::timeout(WAIT, ship_batched(hung, batcher.clone(), handed.clone()));
    alone.await.expect("the phase did not wait for its batch for ever").unwrap();
    assert_eq!(h.shipment(&key).await.as_deref(), Some("in one"), "it went alone");

    let (key, next) = leases.next().unwrap();
    ship_batched(next, batcher, handed).await.unwrap();
    assert_eq!(h.shipment(&key).await.as_deref(), Some("in a batch"), "batching resumed");
    assert_eq!(*shipments.sizes.lock().unwrap(), [1, 1]);
}
