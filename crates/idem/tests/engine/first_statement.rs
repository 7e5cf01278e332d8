//! `claim_first`: a claim that runs the operation's first phase in the statement that stores its
//! key (`InsertInClaim::send`), and what happens when that statement's answer or connection is lost.

use std::sync::Arc;
use std::time::Duration;

use idem::{
    Claim, ClaimArgs, Claimed, EngineConfig, Event, First, IdemError, Interrupted, Request, Step,
};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};

use crate::helpers::{Harness, Point, accounts_with_keys, harness, harness_with, key, order_claim};

/// The sample operation's first phase as one statement that claims its key: `idem_claim` first,
/// then the order, only when it stored the key (after `pause` in the server).
struct InsertInClaim {
    pause: Duration,
    /// Whether the answer is lost after the statement ran (as when its connection fails then).
    lose_answer: bool,
    /// When set, the connection is lost at once while the server still runs the statement (on
    /// this pool, a moment later) and commits it: the client never learns of it.
    orphaned_on: Option<PgPool>,
}

impl InsertInClaim {
    const NOW: Self = Self { pause: Duration::ZERO, lose_answer: false, orphaned_on: None };
}

/// The statement of [`InsertInClaim`].
async fn insert_in_claim(
    executor: impl sqlx::PgExecutor<'_>,
    claim: ClaimArgs<'_>,
    pause: Duration,
) -> Result<(Claimed, Option<i64>), sqlx::Error> {
    sqlx::query_as(
        "WITH claim AS (SELECT idem_claim($1, $2, $3, $4) AS claimed), \
              paused AS (SELECT pg_sleep($5) FROM claim WHERE (claimed).stored), \
              ordered AS (INSERT INTO orders (key_id) SELECT (claimed).id FROM claim, paused \
                          RETURNING id) \
         SELECT claim.claimed, ordered.id FROM claim LEFT JOIN ordered ON true",
    )
    .bind(claim.account)
    .bind(claim.key)
    .bind(claim.credential)
    .bind(claim.fence)
    .bind(pause.as_secs_f64())
    .fetch_one(executor)
    .await
}

impl InsertInClaim {
    /// The statement, as `claim_first` sends it: it leaves the key at `order_created`.
    async fn send(
        &self,
        connection: &mut PgConnection,
        claim: ClaimArgs<'_>,
    ) -> Result<(Claimed, Option<i64>), IdemError> {
        let lost = || IdemError::Database(sqlx::Error::Protocol("connection lost".into()));
        if let Some(pool) = self.orphaned_on.clone() {
            let (account, key, fence) =
                (claim.account.to_owned(), claim.key.to_owned(), claim.fence.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let claim =
                    ClaimArgs { account: &account, key: &key, credential: None, fence: &fence };
                insert_in_claim(&pool, claim, Duration::ZERO)
                    .await
                    .expect("the orphaned statement");
            });
            return Err(lost());
        }
        let (claimed, order) = insert_in_claim(connection, claim, self.pause).await?;
        if self.lose_answer {
            return Err(lost());
        }
        Ok((claimed, order))
    }
}

impl Harness {
    /// `claim_first` of a `/orders` request for acct_1 with `body` and `credential`.
    async fn claim_first_with(
        &self,
        key_value: &str,
        body: &Value,
        credential: Option<&[u8]>,
    ) -> First<i64> {
        let key = key(key_value);
        let credential = credential.map(Into::into);
        let request = Request { credential, ..order_claim("acct_1", &key, body) };
        self.claim_first_by(&request, &InsertInClaim::NOW).await.unwrap()
    }

    /// One sending of `first` for `request` (`Engine::claim_first_once`).
    async fn claim_first_by(
        &self,
        request: &Request,
        first: &InsertInClaim,
    ) -> Result<First<i64>, IdemError> {
        let step = Step::Next(Point::OrderCreated);
        self.engine
            .claim_first_once(request, &step, &async |c, claim| first.send(c, claim).await)
            .await
    }

    async fn claim_first(&self, key_value: &str) -> First<i64> {
        self.claim_first_with(key_value, &json!({"item": "book"}), None).await
    }

    async fn keys(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

/// A claim that runs the first phase: a new key is stored with the phase's writes by one
/// statement, and the lease is at the phase's point; the same statement, sent for the key again,
/// writes nothing and answers as a claim's read would: in use, a mismatch, the replay.
#[sqlx::test(migrations = "../../migrations")]
async fn a_claim_with_its_first_phase_stores_a_new_key_in_one_statement(pool: PgPool) {
    let h = harness(pool).await;
    let First::Ran(lease, order) = h.claim_first("k1").await else {
        panic!("a new key runs its first phase")
    };
    assert_eq!((h.keys().await, h.orders().await), (1, 1));
    assert_eq!(h.recovery_point("k1").await, "order_created");
    assert_eq!(lease.point::<Point>().unwrap(), Point::OrderCreated);
    let order_of_key: i64 = sqlx::query_scalar("SELECT id FROM orders WHERE key_id = $1")
        .bind(lease.key_id())
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(order, order_of_key, "the lease names the key its phase stored");
    assert_eq!(h.events.count(Event::Claimed), 1);

    assert!(matches!(h.claim_first("k1").await, First::Decided(Claim::InUse)));
    let pen = json!({"item": "pen"});
    assert!(matches!(
        h.claim_first_with("k1", &pen, None).await,
        First::Decided(Claim::Mismatch { .. })
    ));
    let answer = h.run(lease).await.unwrap();
    match h.claim_first("k1").await {
        First::Decided(Claim::Replay(replayed)) => assert_eq!(replayed, answer),
        other => panic!("expected the replay, got {other:?}"),
    }
    assert_eq!(
        (h.keys().await, h.orders().await),
        (1, 1),
        "the statements sent again wrote nothing"
    );
    assert_eq!(h.shipper.shipments_made(), 1);
}

/// The claim's credential check holds in the first phase's statement: a dead credential stores no
/// key and writes nothing; a live one stores it.
#[sqlx::test(migrations = "../../migrations")]
async fn a_claim_with_its_first_phase_checks_the_credential_first(pool: PgPool) {
    let h = harness(pool).await;
    accounts_with_keys(&h.pool).await;
    let body = json!({"item": "book"});
    for dead in [[0xbb; 32], [0xdd; 32]] {
        let first = h.claim_first_with("k1", &body, Some(&dead)).await;
        assert!(matches!(first, First::Decided(Claim::Unauthenticated)), "{first:?}");
    }
    assert_eq!((h.keys().await, h.orders().await), (0, 0));
    let first = h.claim_first_with("k1", &body, Some(&[0xaa; 32])).await;
    assert!(matches!(first, First::Ran(..)), "{first:?}");
    assert_eq!((h.keys().await, h.orders().await), (1, 1));
}

/// Many requests with one new key at once: one statement stores it with its order; the others wait
/// on the unique index, are sent again and read it in flight. One key, one order, one holder.
#[sqlx::test(migrations = "../../migrations")]
async fn concurrent_claims_with_their_first_phase_store_the_key_once(pool: PgPool) {
    let h = Arc::new(harness(pool).await);
    let claims = (0..20).map(|_| {
        let h = h.clone();
        tokio::spawn(async move {
            match h.claim_first("storm").await {
                First::Ran(lease, _) => Some(lease),
                First::Decided(Claim::InUse) => None,
                other => panic!("expected the key or in use, got {other:?}"),
            }
        })
    });
    let mut held = Vec::new();
    for claim in claims {
        held.extend(claim.await.unwrap());
    }
    assert_eq!(held.len(), 1, "one holder");
    assert_eq!((h.keys().await, h.orders().await), (1, 1));
    h.run(held.pop().unwrap()).await.unwrap();
    assert_eq!(h.shipper.shipments_made(), 1);
}

/// A process that is stopping sends no first phase; one that began to stop while the phase ran
/// gives the key back at the phase's point, free for a retry elsewhere.
#[sqlx::test(migrations = "../../migrations")]
async fn a_claim_with_its_first_phase_takes_nothing_while_the_process_stops(pool: PgPool) {
    let h = Arc::new(harness(pool).await);
    let running = {
        let h = h.clone();
        tokio::spawn(async move {
            let (key, body) = (key("slow"), json!({"item": "book"}));
            let request = order_claim("acct_1", &key, &body);
            let first = InsertInClaim { pause: Duration::from_millis(300), ..InsertInClaim::NOW };
            h.claim_first_by(&request, &first).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.engine.release_held("stopping").await;
    assert!(running.is_finished(), "release_held returned while a first phase was on its way");
    assert!(matches!(running.await.unwrap(), Err(IdemError::LeaseLost)));
    let free: (bool, String) = sqlx::query_as(
        "SELECT owner_token IS NULL AND locked_until IS NULL, recovery_point \
         FROM idempotency_keys WHERE idempotency_key = 'slow'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(free, (true, "order_created".to_owned()), "given back at its recovery point");

    assert!(matches!(h.claim_first("late").await, First::Decided(Claim::InUse)));
    let late: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'late'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(late, 0, "nothing sent once the process stops");
}

/// A first statement that stored its key but whose answer never came back (its connection failed
/// after the commit): the engine cannot know the key's id, so it gives the key back by its account
/// and key, fenced on its token, and a retry resumes it at once instead of waiting out the lease.
#[sqlx::test(migrations = "../../migrations")]
async fn a_first_statement_whose_answer_is_lost_gives_its_key_back(pool: PgPool) {
    let h = harness(pool).await;
    let (key, body) = (key("lost"), json!({"item": "book"}));
    let request = order_claim("acct_1", &key, &body);
    let first = InsertInClaim { lose_answer: true, ..InsertInClaim::NOW };
    let lost = h.claim_first_by(&request, &first).await;
    assert!(matches!(lost, Err(IdemError::Database(_))), "{lost:?}");
    let free: (bool, String) = sqlx::query_as(
        "SELECT owner_token IS NULL AND locked_until IS NULL, recovery_point \
         FROM idempotency_keys WHERE idempotency_key = 'lost'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(free, (true, "order_created".to_owned()), "stored, and given back");
    assert_eq!(h.events.count(Event::Released), 1);
    let First::Open(open) = h.claim_first("lost").await else { panic!("a free key is open") };
    assert!(matches!(h.engine.take(open, &request).await.unwrap(), Some(Claim::Acquired(_))));
    assert_eq!(h.orders().await, 1);
}

/// A first statement whose connection is lost while the server still runs it: the give-back that
/// follows at once finds nothing (not committed yet); the engine looks again once the statement
/// must have ended, and gives the key back then, instead of leaving it leased to no one.
#[sqlx::test(migrations = "../../migrations")]
async fn a_first_statement_orphaned_in_the_server_gives_its_key_back_once_it_ends(pool: PgPool) {
    let config = EngineConfig { claim_timeout: Duration::from_millis(300), ..Default::default() };
    let h = harness_with(pool, config).await;
    let (key, body) = (key("orphan"), json!({"item": "book"}));
    let request = order_claim("acct_1", &key, &body);
    let first = InsertInClaim { orphaned_on: Some(h.pool.clone()), ..InsertInClaim::NOW };
    let lost = h.claim_first_by(&request, &first).await;
    assert!(matches!(lost, Err(IdemError::Database(_))), "{lost:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let free: (bool, String) = sqlx::query_as(
        "SELECT owner_token IS NULL AND locked_until IS NULL, recovery_point \
         FROM idempotency_keys WHERE idempotency_key = 'orphan'",
    )
    .fetch_one(&h.pool)
    .await
    .expect("the orphaned statement stored the key");
    assert_eq!(free, (true, "order_created".to_owned()), "stored, and given back later");
    let First::Open(open) = h.claim_first("orphan").await else { panic!("a free key is open") };
    assert!(matches!(h.engine.take(open, &request).await.unwrap(), Some(Claim::Acquired(_))));
}

/// The claim with the first phase waits no longer than a claim may (`claim_timeout`), and a wait
/// it gives up on (a lock on a table the phase writes, held by a migration, say) still lets a read
/// answer a replay; a new key's claim gives up, storing nothing.
#[sqlx::test(migrations = "../../migrations")]
async fn a_claim_with_its_first_phase_waits_no_longer_than_a_claim(pool: PgPool) {
    let config = EngineConfig { claim_timeout: Duration::from_millis(300), ..Default::default() };
    let h = harness_with(pool, config).await;
    let First::Ran(lease, _) = h.claim_first("done").await else { panic!("a new key") };
    let answer = h.run(lease).await.unwrap();
    let mut migration = h.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE orders IN SHARE MODE").execute(&mut *migration).await.unwrap();

    let started = std::time::Instant::now();
    match h.claim_first("done").await {
        First::Decided(Claim::Replay(replayed)) => assert_eq!(replayed, answer),
        other => panic!("expected the replay, got {other:?}"),
    }
    let (key, body) = (key("blocked"), json!({"item": "book"}));
    let first = InsertInClaim::NOW;
    let blocked = h.claim_first_by(&order_claim("acct_1", &key, &body), &first).await;
    assert!(
        matches!(&blocked, Err(IdemError::Database(err)) if err.as_database_error()
            .and_then(|db| db.code())
            .is_some_and(|code| code == "55P03" || code == "57014")),
        "{blocked:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    migration.rollback().await.unwrap();
    assert_eq!(h.keys().await, 1, "the blocked claim stored nothing");
}

/// A process that is stopping takes no key, but answers what a read decides: a replay, a refusal.
#[sqlx::test(migrations = "../../migrations")]
async fn a_stopping_process_answers_a_replay_from_its_first_statement_claim(pool: PgPool) {
    let config = EngineConfig { answer_memory: 0, ..Default::default() };
    let h = harness_with(pool, config).await;
    let First::Ran(lease, _) = h.claim_first("done").await else { panic!("a new key") };
    let answer = h.run(lease).await.unwrap();
    h.engine.release_held("stopping").await;
    match h.claim_first("done").await {
        First::Decided(Claim::Replay(replayed)) => assert_eq!(replayed, answer),
        other => panic!("expected the replay, got {other:?}"),
    }
    let pen = json!({"item": "pen"});
    assert!(matches!(
        h.claim_first_with("done", &pen, None).await,
        First::Decided(Claim::Mismatch { .. })
    ));
    assert!(matches!(h.claim_first("new").await, First::Decided(Claim::InUse)));
    assert_eq!(h.keys().await, 1);
}

/// A key stored at its first point before its first phase ran (here, by a check before a foreign
/// call): a claim with the first phase finds it open and stores nothing; the key is taken over and
/// driven from that point on the reference road, fenced on the new lease.
#[sqlx::test(migrations = "../../migrations")]
async fn a_key_stored_before_its_first_phase_is_taken_over_and_driven_from_it(pool: PgPool) {
    let h = harness(pool).await;
    let mut stored = h.acquire("k1").await;
    stored.before_call().await.unwrap();
    assert_eq!(h.recovery_point("k1").await, "started");
    h.expire_lease("k1").await;
    let First::Open(open) = h.claim_first("k1").await else { panic!("an unfinished key is open") };
    assert_eq!(h.orders().await, 0, "the claim with the first phase wrote nothing");
    let (key, body) = (key("k1"), json!({"item": "book"}));
    let Some(Claim::Acquired(lease)) =
        h.engine.take(open, &order_claim("acct_1", &key, &body)).await.unwrap()
    else {
        panic!("the expired lease is taken over")
    };
    assert_eq!(h.run(lease).await.unwrap().status, 201);
    assert_eq!(h.orders().await, 1);
    // The holder whose lease was taken over cannot move the key any more: its first phase fails
    // on the order the new holder wrote (before its fence), and it learns it lost the lease.
    let late = h.run(stored).await;
    assert!(matches!(late, Err(Interrupted::LeaseLost)), "{late:?}");
    assert_eq!(h.orders().await, 1);
    assert_eq!(h.recovery_point("k1").await, "finished");
}

/// `claim_first` whole: a key its statement finds open is taken over in the same call, at the
/// key's own point and with no rows of the first phase; a new key is stored with its rows.
#[sqlx::test(migrations = "../../migrations")]
async fn claim_first_takes_over_a_key_it_finds_open_and_stores_a_new_one(pool: PgPool) {
    let h = harness(pool).await;
    let mut stored = h.acquire("open").await;
    stored.before_call().await.unwrap();
    h.expire_lease("open").await;
    let first = InsertInClaim::NOW;
    let body = json!({"item": "book"});
    for (value, point, rows) in
        [("open", Point::Started, None), ("new", Point::OrderCreated, Some(1))]
    {
        let key = key(value);
        let request = order_claim("acct_1", &key, &body);
        let step = Step::Next(Point::OrderCreated);
        let (claim, made) = h
            .engine
            .claim_first(&request, step, async |c, claim| first.send(c, claim).await)
            .await
            .unwrap();
        let Claim::Acquired(lease) = claim else { panic!("{value}: acquired, got {claim:?}") };
        assert_eq!(lease.point::<Point>().unwrap(), point, "{value}");
        assert_eq!(made.is_some(), rows.is_some(), "{value}");
        assert_eq!(h.orders().await, rows.unwrap_or(0), "{value}");
    }
}
