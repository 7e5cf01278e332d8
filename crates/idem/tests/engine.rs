//! The engine against a real Postgres: every claim outcome, resumption from every recovery point,
//! takeovers, fencing, races, rollbacks, dropped futures and retried serialization failures.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::batch::{Batch, Batcher};
use idem::{
    Claim, ClaimArgs, ClaimRequest, Claimed, Engine, EngineConfig, Event, FenceRecord, Fingerprint,
    First, FirstStatement, IdempotencyKey, Interrupted, Lease, Observer, OneStatement, Operation,
    PhaseError, Read, RecoveryPoint, RequestParts, Step, StoredResponse, TransientKind, drive,
};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};

// ---------------------------------------------------------------------------------------------
// A sample operation: `started` → (phase: insert an order) → `order_created` → (foreign call:
// ship, with a downstream key derived from the order) → (phase: record the shipment) → `shipped`
// → (phase: store the response) → finished.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Started,
    OrderCreated,
    Shipped,
}

impl RecoveryPoint for Point {
    fn name(self) -> &'static str {
        match self {
            Point::Started => "started",
            Point::OrderCreated => "order_created",
            Point::Shipped => "shipped",
        }
    }
    fn from_name(name: &str) -> Option<Self> {
        [Point::Started, Point::OrderCreated, Point::Shipped].into_iter().find(|p| p.name() == name)
    }
}

/// A downstream service with Stripe's idempotency: the same key returns the same shipment.
#[derive(Default)]
struct Shipper {
    shipments: Mutex<HashMap<String, String>>,
    calls: AtomicUsize,
    /// How many of the next calls fail (after doing nothing).
    failures: AtomicUsize,
    /// When set, calls never answer.
    hang: std::sync::atomic::AtomicBool,
}

impl Shipper {
    async fn ship(&self, downstream_key: &str) -> Result<String, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.failures.load(Ordering::SeqCst) > 0 {
            self.failures.fetch_sub(1, Ordering::SeqCst);
            return Err("shipper unavailable".into());
        }
        let mut shipments = self.shipments.lock().unwrap();
        let count = shipments.len();
        Ok(shipments
            .entry(downstream_key.to_owned())
            .or_insert_with(|| format!("shp_{count}"))
            .clone())
    }

    fn shipments_made(&self) -> usize {
        self.shipments.lock().unwrap().len()
    }
}

struct PlaceOrder {
    shipper: Arc<Shipper>,
    pool: PgPool,
}

impl Operation for PlaceOrder {
    type Point = Point;

    async fn step(&mut self, lease: &mut Lease, at: Point) -> Result<(), Interrupted> {
        let key_id = lease.key_id();
        match at {
            Point::Started => {
                Insert::order(key_id).run(lease).await?;
            }
            Point::OrderCreated => {
                let order_id: i64 = sqlx::query_scalar("SELECT id FROM orders WHERE key_id = $1")
                    .bind(key_id)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| Interrupted::Transient {
                        kind: TransientKind::Internal,
                        detail: e.to_string(),
                    })?;
                let shipment = self.shipper.ship(&format!("order_{order_id}/ship")).await.map_err(
                    |detail| Interrupted::Transient { kind: TransientKind::Processor, detail },
                )?;
                let mut tx = lease.begin().await?;
                sqlx::query("UPDATE orders SET shipment = $2 WHERE key_id = $1")
                    .bind(key_id)
                    .bind(&shipment)
                    .execute(&mut *tx)
                    .await?;
                tx.commit_next(Point::Shipped).await?;
            }
            Point::Shipped => {
                let mut tx = lease.begin().await?;
                let (id, shipment): (i64, String) =
                    sqlx::query_as("SELECT id, shipment FROM orders WHERE key_id = $1")
                        .bind(key_id)
                        .fetch_one(&mut *tx)
                        .await?;
                let body = json!({"order": id, "shipment": shipment}).to_string().into_bytes();
                let response = StoredResponse::json(201, body)
                    .with_header("location", format!("/orders/{id}"));
                tx.commit_answer(response).await?;
            }
        }
        Ok(())
    }
}

/// Inserts an order for the key (`shipment` set, when given), after `pause`, then moves to
/// `order_created`, fails or hangs as `outcome` says.
struct Insert {
    key_id: i64,
    shipment: Option<&'static str>,
    pause: Duration,
    outcome: Outcome,
}

#[derive(Clone, Copy)]
enum Outcome {
    Next,
    Fail,
    Hang,
}

impl Insert {
    /// The sample operation's first phase.
    fn order(key_id: i64) -> Self {
        Self { key_id, shipment: None, pause: Duration::ZERO, outcome: Outcome::Next }
    }
}

impl Insert {
    /// Runs the insert as a phase of `lease`.
    async fn run(self, lease: &mut Lease) -> Result<(), Interrupted> {
        let mut tx = lease.begin().await?;
        tokio::time::sleep(self.pause).await;
        sqlx::query("INSERT INTO orders (key_id, shipment) VALUES ($1, $2)")
            .bind(self.key_id)
            .bind(self.shipment)
            .execute(&mut *tx)
            .await?;
        match self.outcome {
            Outcome::Next => tx.commit_next(Point::OrderCreated).await,
            Outcome::Fail => Err(Interrupted::Transient {
                kind: TransientKind::Internal,
                detail: "something broke after a write".into(),
            }),
            Outcome::Hang => std::future::pending().await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Harness.

#[derive(Default)]
struct Counter(Mutex<Vec<Event>>);

impl Observer for Counter {
    fn event(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

impl Counter {
    fn count(&self, event: Event) -> usize {
        self.0.lock().unwrap().iter().filter(|e| **e == event).count()
    }
}

struct Harness {
    pool: PgPool,
    engine: Engine,
    events: Arc<Counter>,
    shipper: Arc<Shipper>,
}

async fn harness(pool: PgPool) -> Harness {
    harness_with(pool, EngineConfig::default()).await
}

async fn harness_with(pool: PgPool, config: EngineConfig) -> Harness {
    sqlx::query(
        "CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         key_id bigint NOT NULL UNIQUE REFERENCES idempotency_keys (id), shipment text)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let events = Arc::new(Counter::default());
    let config = EngineConfig { lease: Duration::from_secs(30), ..config };
    let engine = Engine::new(pool.clone(), config, events.clone());
    Harness { pool, engine, events, shipper: Arc::new(Shipper::default()) }
}

fn key(value: &str) -> IdempotencyKey {
    IdempotencyKey::parse(value.as_bytes()).unwrap()
}

fn fingerprint(body: &Value) -> Fingerprint {
    Fingerprint::of(&RequestParts {
        method: "POST",
        path: "/orders",
        query: "",
        media_type: "application/json",
        version: None,
        body,
    })
}

/// The sample operation's name.
const ORDERS_PLACE: &str = "orders.place";

/// The claim of a `/orders` request for `account` with `body`.
fn order_claim<'a>(account: &'a str, key: &'a IdempotencyKey, body: &'a Value) -> ClaimRequest<'a> {
    ClaimRequest {
        account_id: account,
        credential: None,
        key,
        fingerprint: fingerprint(body),
        method: "POST",
        path: "/orders",
        request_id: "req_test",
        operation: ORDERS_PLACE,
        params: body,
    }
}

impl Harness {
    async fn claim_as(&self, account: &str, key_value: &str, body: &Value) -> Claim {
        let key = key(key_value);
        self.engine.claim(&order_claim(account, &key, body)).await.unwrap()
    }

    /// A claim that also checks an API-key digest, as the API sends it for a known caller.
    async fn claim_with_credential(&self, key_value: &str, credential: &[u8]) -> Claim {
        let (key, body) = (key(key_value), json!({"item": "book"}));
        let request =
            ClaimRequest { credential: Some(credential), ..order_claim("acct_1", &key, &body) };
        self.engine.claim(&request).await.unwrap()
    }

    async fn claim(&self, key_value: &str) -> Claim {
        self.claim_as("acct_1", key_value, &json!({"item": "book"})).await
    }

    async fn acquire(&self, key_value: &str) -> Lease {
        match self.claim(key_value).await {
            Claim::Acquired(lease) => lease,
            other => panic!("expected to acquire the key, got {other:?}"),
        }
    }

    fn operation(&self) -> PlaceOrder {
        PlaceOrder { shipper: self.shipper.clone(), pool: self.pool.clone() }
    }

    async fn run(&self, lease: Lease) -> Result<StoredResponse, Interrupted> {
        drive(&mut self.operation(), lease).await
    }

    /// Moves a key's lease into the past, as if its holder had stalled that long.
    async fn expire_lease(&self, key_value: &str) {
        sqlx::query("UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE idempotency_key = $1 AND locked_until IS NOT NULL")
            .bind(key_value)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    async fn recovery_point(&self, key_value: &str) -> String {
        sqlx::query_scalar("SELECT recovery_point FROM idempotency_keys WHERE idempotency_key = $1")
            .bind(key_value)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The shipment of the order under `key_value`.
    async fn shipment(&self, key_value: &str) -> Option<String> {
        sqlx::query_scalar(
            "SELECT shipment FROM orders o JOIN idempotency_keys k ON k.id = o.key_id \
              WHERE k.idempotency_key = $1",
        )
        .bind(key_value)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn orders(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&self.pool).await.unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// One test per claim outcome.

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

/// Two live keys of acct_1 (`aa…`, `ee…`), one of acct_2 (`bb…`).
async fn accounts_with_keys(pool: &PgPool) {
    sqlx::raw_sql(
        "INSERT INTO accounts (id, name) VALUES ('acct_1', 'one'), ('acct_2', 'two'); \
         INSERT INTO api_keys (id, account_id, key_hash, last4) VALUES \
           ('key_live', 'acct_1', decode(repeat('aa', 32), 'hex'), 'aaaa'), \
           ('key_second', 'acct_1', decode(repeat('ee', 32), 'hex'), 'eeee'), \
           ('key_other', 'acct_2', decode(repeat('bb', 32), 'hex'), 'bbbb')",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Changes a finished key's stored answer and path behind the engine's back (nothing does that
/// but this test), so that a claim shows whether its answer came from memory or from the database.
async fn tamper(pool: &PgPool, key_value: &str) {
    sqlx::query(
        "UPDATE idempotency_keys SET response_body = '\"tampered\"', request_path = '/tampered' \
         WHERE idempotency_key = $1",
    )
    .bind(key_value)
    .execute(pool)
    .await
    .unwrap();
}

/// Finishes `k1` with `credential` and replays it once from the database, which keeps its answer
/// in memory; tampers with the stored answer, and checks that the next replay is the original:
/// from memory.
async fn kept_in_memory(h: &Harness, credential: &[u8]) {
    let Claim::Acquired(lease) = h.claim_with_credential("k1", credential).await else {
        panic!("a live credential claims the key")
    };
    let first = String::from_utf8(h.run(lease).await.unwrap().body).unwrap();
    assert_eq!(replayed_body(h.claim_with_credential("k1", credential).await), first);
    tamper(&h.pool, "k1").await;
    let before = h.events.count(Event::AnsweredFromMemory);
    assert_eq!(
        replayed_body(h.claim_with_credential("k1", credential).await),
        first,
        "from memory"
    );
    assert_eq!(h.events.count(Event::AnsweredFromMemory), before + 1);
}

fn replayed_body(claim: Claim) -> String {
    match claim {
        Claim::Replay(replayed) => String::from_utf8(replayed.body).unwrap(),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// A replay read from the database leaves its answer in memory, and the next one is answered from
/// there; but a key revoked since, by any statement on `api_keys`, is refused at once, as a read
/// of the database would refuse it, and so is a key of another account.
#[sqlx::test(migrations = "../../migrations")]
async fn replays_from_memory_refuse_a_key_revoked_before_they_arrived(pool: PgPool) {
    let h = harness(pool).await;
    accounts_with_keys(&h.pool).await;
    let (live, second, other) = ([0xaa; 32], [0xee; 32], [0xbb; 32]);
    kept_in_memory(&h, &live).await;
    assert!(matches!(h.claim_with_credential("k1", &other).await, Claim::Unauthenticated));
    // The second key of the account was never checked: it reads the database.
    assert_eq!(replayed_body(h.claim_with_credential("k1", &second).await), "\"tampered\"");

    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE id = 'key_live'")
        .execute(&h.pool)
        .await
        .unwrap();
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Unauthenticated));
    // Any change to api_keys moves the version: the live key is checked again, in the database.
    assert_eq!(replayed_body(h.claim_with_credential("k1", &second).await), "\"tampered\"");
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Unauthenticated));
}

/// A copy in memory answers only its own account's key, to a credential found live for that
/// account; a different body under the key is the mismatch the database would answer; and
/// deleting a key from `api_keys` changes the version as a revocation does.
#[sqlx::test(migrations = "../../migrations")]
async fn replays_from_memory_keep_to_their_account_and_answer_mismatches(pool: PgPool) {
    let h = harness(pool).await;
    accounts_with_keys(&h.pool).await;
    let live = [0xaa; 32];
    kept_in_memory(&h, &live).await;
    let (book, pen) = (json!({"item": "book"}), json!({"item": "pen"}));
    let claim = |account, credential: &'static [u8], body| {
        let (h, key) = (&h, key("k1"));
        async move {
            let request =
                ClaimRequest { credential: Some(credential), ..order_claim(account, &key, body) };
            h.engine.claim(&request).await.unwrap()
        }
    };
    // acct_2's own k1 is another key: new, and once finished, its own answer.
    let Claim::Acquired(lease) = claim("acct_2", &[0xbb; 32], &book).await else {
        panic!("acct_2's k1 is a key of its own")
    };
    let theirs = String::from_utf8(h.run(lease).await.unwrap().body).unwrap();
    assert_eq!(replayed_body(claim("acct_2", &[0xbb; 32], &book).await), theirs);
    assert_ne!(replayed_body(claim("acct_1", &[0xaa; 32], &book).await), theirs);
    // acct_2's key, found live for acct_2, is not acct_1's.
    assert!(matches!(claim("acct_1", &[0xbb; 32], &book).await, Claim::Unauthenticated));

    // The mismatch comes from memory too (the key's path in the database was tampered with).
    match claim("acct_1", &[0xaa; 32], &pen).await {
        Claim::Mismatch { path, .. } => assert_eq!(path, "/orders"),
        other => panic!("expected a mismatch, got {other:?}"),
    }

    sqlx::query("DELETE FROM api_keys WHERE id = 'key_live'").execute(&h.pool).await.unwrap();
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Unauthenticated));
}

/// An answer kept in memory is used only inside the key's retention window by the database
/// clock: past it, the claim reads the key (which the reaper may have deleted, and then the key
/// is new).
#[sqlx::test(migrations = "../../migrations")]
async fn replays_from_memory_end_with_the_keys_retention(pool: PgPool) {
    let retention = Duration::from_secs(5);
    let h = harness_with(pool, EngineConfig { retention, ..EngineConfig::default() }).await;
    accounts_with_keys(&h.pool).await;
    let live = [0xaa; 32];
    kept_in_memory(&h, &live).await;

    tokio::time::sleep(retention).await;
    assert_eq!(replayed_body(h.claim_with_credential("k1", &live).await), "\"tampered\"");
    // The test's own table refers to the key; a payment would not.
    sqlx::query("DELETE FROM orders").execute(&h.pool).await.unwrap();
    let reaped = h.engine.reap(100).await.unwrap();
    assert_eq!(reaped.deleted, 1);
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Acquired(_)));
}

/// With no memory for answers, every replay reads its key.
#[sqlx::test(migrations = "../../migrations")]
async fn without_memory_for_answers_every_replay_reads_its_key(pool: PgPool) {
    let h = harness_with(pool, EngineConfig { answer_memory: 0, ..EngineConfig::default() }).await;
    accounts_with_keys(&h.pool).await;
    let live = [0xaa; 32];
    let Claim::Acquired(lease) = h.claim_with_credential("k1", &live).await else {
        panic!("a live credential claims the key")
    };
    h.run(lease).await.unwrap();
    h.claim_with_credential("k1", &live).await;
    tamper(&h.pool, "k1").await;
    assert_eq!(replayed_body(h.claim_with_credential("k1", &live).await), "\"tampered\"");
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

impl FirstStatement for InsertInClaim {
    type Point = Point;
    type Error = String;
    type Output = i64;

    fn step(&self) -> Step<Point> {
        Step::Next(Point::OrderCreated)
    }

    async fn run(
        &mut self,
        connection: &mut PgConnection,
        claim: ClaimArgs<'_>,
    ) -> Result<(Claimed, Option<i64>), PhaseError<String>> {
        let lost = || PhaseError::Database(sqlx::Error::Protocol("connection lost".into()));
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
        let request = ClaimRequest { credential, ..order_claim("acct_1", &key, body) };
        let mut first = InsertInClaim::NOW;
        self.engine.claim_first(&request, &mut first).await.unwrap()
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
            let mut first =
                InsertInClaim { pause: Duration::from_millis(300), ..InsertInClaim::NOW };
            h.engine.claim_first(&request, &mut first).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.engine.release_held("stopping").await;
    assert!(running.is_finished(), "release_held returned while a first phase was on its way");
    assert!(matches!(running.await.unwrap(), Err(PhaseError::LeaseLost)));
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
    let mut first = InsertInClaim { lose_answer: true, ..InsertInClaim::NOW };
    let lost = h.engine.claim_first(&request, &mut first).await;
    assert!(matches!(lost, Err(PhaseError::Database(_))), "{lost:?}");
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
    let mut first = InsertInClaim { orphaned_on: Some(h.pool.clone()), ..InsertInClaim::NOW };
    let lost = h.engine.claim_first(&request, &mut first).await;
    assert!(matches!(lost, Err(PhaseError::Database(_))), "{lost:?}");
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
    let mut first = InsertInClaim::NOW;
    let blocked = h.engine.claim_first(&order_claim("acct_1", &key, &body), &mut first).await;
    assert!(
        matches!(&blocked, Err(PhaseError::Database(err)) if err.as_database_error()
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

/// A key stored at its first point before its first phase ran (a release that stored keys when it
/// claimed them; here, a check before a foreign call): the claim finds it open, takes it over, and
/// the same first statement moves it, fenced on the lease.
#[sqlx::test(migrations = "../../migrations")]
async fn a_first_statement_runs_as_the_phase_of_a_key_stored_before(pool: PgPool) {
    let h = harness(pool).await;
    let mut stored = h.acquire("k1").await;
    stored.before_call().await.unwrap();
    assert_eq!(h.recovery_point("k1").await, "started");
    h.expire_lease("k1").await;
    let First::Open(open) = h.claim_first("k1").await else { panic!("an unfinished key is open") };
    let (key, body) = (key("k1"), json!({"item": "book"}));
    let Some(Claim::Acquired(mut lease)) =
        h.engine.take(open, &order_claim("acct_1", &key, &body)).await.unwrap()
    else {
        panic!("the expired lease is taken over")
    };
    let order = lease.phase_first(InsertInClaim::NOW).await.unwrap();
    assert_eq!(h.recovery_point("k1").await, "order_created");
    assert_eq!(h.orders().await, 1);
    // The holder whose lease was taken over cannot move the key any more.
    let late = stored.phase_first(InsertInClaim::NOW).await;
    assert!(matches!(late, Err(PhaseError::LeaseLost)), "{late:?}");
    assert_eq!(h.orders().await, 1, "{order}");
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

// ---------------------------------------------------------------------------------------------
// Resumption, takeover and fencing.

/// A one-statement phase: the operation's statement sets the order's shipment, if there is one,
/// and calls `idem_commit_fence($fence)` beside it, so both commit together or not at all.
struct ShipInOne {
    step: Step<Point>,
}

impl OneStatement for ShipInOne {
    type Point = Point;
    type Error = String;
    type Output = ();

    fn step(&self) -> Step<Point> {
        self.step.clone()
    }

    async fn run(
        &mut self,
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

    lease.phase_in_one(ShipInOne { step: Step::Next(Point::Shipped) }).await.unwrap();
    assert_eq!(h.recovery_point("single").await, "shipped");
    assert_eq!(h.shipment("single").await.as_deref(), Some("in one"), "the statement's own write");
    assert_eq!(lease.point::<Point>().unwrap(), Point::Shipped);
    let answer = StoredResponse::json(201, b"{\"shipped\":true}".to_vec());
    lease.phase_in_one(ShipInOne { step: Step::Finish(answer.clone()) }).await.unwrap();
    assert!(matches!(h.claim("single").await, Claim::Replay(stored) if stored == answer));

    // Another key, whose holder stalls past its lease while a retry takes it over.
    let mut stalled = h.acquire("stalled").await;
    h.operation().step(&mut stalled, Point::Started).await.unwrap();
    h.expire_lease("stalled").await;
    let _taken = h.acquire("stalled").await;
    let late = stalled.phase_in_one(ShipInOne { step: Step::Next(Point::Shipped) }).await;
    assert!(matches!(late, Err(PhaseError::LeaseLost)), "{late:?}");
    assert_eq!(h.recovery_point("stalled").await, "order_created");
    let shipment = h.shipment("stalled").await;
    assert_eq!(shipment, None, "the late statement's own write rolled back with its fence");
}

/// Shipments written in batches: one statement for every row, each order's shipment set where
/// its key's fence moved it. Records the size of every batch; with `hold_first`, its first batch
/// waits for `release` before it sends anything.
#[derive(Default)]
struct Shipments {
    sizes: Mutex<Vec<usize>>,
    hold_first: std::sync::atomic::AtomicBool,
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

/// `ShipInOne`, batched: alone it ships "in one", in a batch "in a batch". Counts the phases that
/// handed the batcher their row.
struct ShipInBatch {
    batcher: Batcher<ShipmentBatch>,
    handed: Arc<AtomicUsize>,
}

impl OneStatement for ShipInBatch {
    type Point = Point;
    type Error = String;
    type Output = ();

    fn step(&self) -> Step<Point> {
        Step::Next(Point::Shipped)
    }

    async fn run(
        &mut self,
        connection: &mut PgConnection,
        fence: &FenceRecord,
    ) -> Result<(i64, ()), PhaseError<String>> {
        ShipInOne { step: self.step() }.run(connection, fence).await
    }

    async fn run_batched(&mut self, fence: &FenceRecord) -> Option<(i64, ())> {
        self.handed.fetch_add(1, Ordering::SeqCst);
        self.batcher.send("in a batch".to_owned(), fence).await.map(|key_id| (key_id, ()))
    }
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

/// Waits (at most five seconds) until `done` holds.
async fn until(done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("still not so after five seconds");
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
    for (i, (_, mut lease)) in leases.into_iter().enumerate() {
        let statement = ShipInBatch { batcher: batcher.clone(), handed: handed.clone() };
        phases.push(tokio::spawn(async move { lease.phase_in_one(statement).await }));
        if i == 0 {
            // The first phase's batch is under way (and waits) before the others arrive.
            until(|| shipments.sizes.lock().unwrap().len() == 1).await;
        }
    }
    until(|| handed.load(Ordering::SeqCst) == 4).await;
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
    let (_, mut held) = leases.next().unwrap();
    let statement = ShipInBatch { batcher: batcher.clone(), handed: handed.clone() };
    let first = tokio::spawn(async move { held.phase_in_one(statement).await });
    until(|| shipments.sizes.lock().unwrap().len() == 1).await;
    tokio::time::sleep(idem::batch::STUCK).await;

    let (key, mut late) = leases.next().unwrap();
    let statement = ShipInBatch { batcher: batcher.clone(), handed: handed.clone() };
    late.phase_in_one(statement).await.unwrap();
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
    for (key, mut lease) in leases {
        let statement = ShipInBatch { batcher: batcher.clone(), handed: handed.clone() };
        phases.push((key, tokio::spawn(async move { lease.phase_in_one(statement).await })));
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

/// A one-statement phase that reports the server session it ran on, after `pause` in the server.
struct ShipSlowly {
    pause: Duration,
}

impl OneStatement for ShipSlowly {
    type Point = Point;
    type Error = String;
    type Output = i32;

    fn step(&self) -> Step<Point> {
        Step::Next(Point::Shipped)
    }

    async fn run(
        &mut self,
        connection: &mut PgConnection,
        fence: &FenceRecord,
    ) -> Result<(i64, i32), PhaseError<String>> {
        let (key_id, pid) = sqlx::query_as(
            "WITH pause AS (SELECT pg_sleep($2)), \
                  fence AS (SELECT idem_commit_fence($1) AS key_id FROM pause) \
             SELECT key_id, pg_backend_pid() FROM fence",
        )
        .bind(fence)
        .bind(self.pause.as_secs_f64())
        .fetch_one(connection)
        .await?;
        Ok((key_id, pid))
    }
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
        lease.phase_in_one(ShipSlowly { pause: Duration::ZERO }).await.unwrap()
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
        lease.phase_in_one(ShipSlowly { pause: Duration::from_millis(500) }),
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

/// A new key stored by its first phase with a JSON `null` for its frozen call stores no call, as
/// `idem_commit` did: the call is planned again before it is made, never read back as one, by
/// the holder that planned it either.
#[sqlx::test(migrations = "../../migrations")]
async fn a_null_plan_is_stored_as_no_plan(pool: PgPool) {
    let h = harness(pool).await;
    let mut lease = h.acquire("null-plan").await;
    lease
        .phase_in_one(ShipInOne { step: Step::Call(Point::OrderCreated, Value::Null) })
        .await
        .unwrap();
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

// ---------------------------------------------------------------------------------------------
// Random interleavings of requests, crashes, stalls, outages and completer runs on one key.
// The model: a key has either no stored answer or exactly one, which never changes; the shipper
// saw at most one shipment for it; and once every lease has run out and the completer has had its
// turn, the key is finished with exactly one shipment.

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

// ---------------------------------------------------------------------------------------------
// The completer's give-up bound counts its own attempts only.

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
