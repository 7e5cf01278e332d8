//! What the tests share: a sample operation and the harness that drives it.
//!
//! The sample operation: `started` → (phase: insert an order) → `order_created` → (foreign call:
//! ship, with a downstream key derived from the order) → (phase: record the shipment) → `shipped`
//! → (phase: store the response) → finished.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{
    Claim, Engine, EngineConfig, Event, Fingerprint, IdempotencyKey, Interrupted, Lease, Observer,
    Operation, RecoveryPoint, Request, RequestParts, StoredResponse, TransientKind, drive,
};
use serde_json::{Value, json};
use sqlx::PgPool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Point {
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
pub(crate) struct Shipper {
    shipments: Mutex<HashMap<String, String>>,
    pub(crate) calls: AtomicUsize,
    /// How many of the next calls fail (after doing nothing).
    pub(crate) failures: AtomicUsize,
    /// When set, calls never answer.
    pub(crate) hang: std::sync::atomic::AtomicBool,
}

impl Shipper {
    pub(crate) async fn ship(&self, downstream_key: &str) -> Result<String, String> {
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

    pub(crate) fn shipments_made(&self) -> usize {
        self.shipments.lock().unwrap().len()
    }
}

pub(crate) struct PlaceOrder {
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
pub(crate) struct Insert {
    pub(crate) key_id: i64,
    pub(crate) shipment: Option<&'static str>,
    pub(crate) pause: Duration,
    pub(crate) outcome: Outcome,
}

#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    Next,
    Fail,
    Hang,
}

impl Insert {
    /// The sample operation's first phase.
    pub(crate) fn order(key_id: i64) -> Self {
        Self { key_id, shipment: None, pause: Duration::ZERO, outcome: Outcome::Next }
    }
}

impl Insert {
    /// Runs the insert as a phase of `lease`.
    pub(crate) async fn run(self, lease: &mut Lease) -> Result<(), Interrupted> {
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

#[derive(Default)]
pub(crate) struct Counter(Mutex<Vec<Event>>);

impl Observer for Counter {
    fn event(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

impl Counter {
    pub(crate) fn count(&self, event: Event) -> usize {
        self.0.lock().unwrap().iter().filter(|e| **e == event).count()
    }
}

pub(crate) struct Harness {
    pub(crate) pool: PgPool,
    pub(crate) engine: Engine,
    pub(crate) events: Arc<Counter>,
    pub(crate) shipper: Arc<Shipper>,
}

pub(crate) async fn harness(pool: PgPool) -> Harness {
    harness_with(pool, EngineConfig::default()).await
}

pub(crate) async fn harness_with(pool: PgPool, config: EngineConfig) -> Harness {
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

pub(crate) fn key(value: &str) -> IdempotencyKey {
    IdempotencyKey::parse(value.as_bytes()).unwrap()
}

pub(crate) fn fingerprint(body: &Value) -> Fingerprint {
    Fingerprint::of(&RequestParts {
        method: "POST",
        path: "/orders",
        query: "",
        media_type: "application/json",
        version: None,
        if_match: None,
        body,
    })
}

/// The sample operation's name.
pub(crate) const ORDERS_PLACE: &str = "orders.place";

/// The claim of a `/orders` request for `account` with `body`.
pub(crate) fn order_claim(account: &str, key: &IdempotencyKey, body: &Value) -> Request {
    Request {
        account_id: account.into(),
        credential: None,
        key: key.clone(),
        fingerprint: fingerprint(body),
        method: "POST".into(),
        path: "/orders".into(),
        request_id: "req_test".into(),
        operation: ORDERS_PLACE.into(),
        params: body.clone().into(),
    }
}

impl Harness {
    pub(crate) async fn claim_as(&self, account: &str, key_value: &str, body: &Value) -> Claim {
        let key = key(key_value);
        self.engine.claim(&order_claim(account, &key, body)).await.unwrap()
    }

    /// A claim that also checks an API-key digest, as the API sends it for a known caller.
    pub(crate) async fn claim_with_credential(&self, key_value: &str, credential: &[u8]) -> Claim {
        let (key, body) = (key(key_value), json!({"item": "book"}));
        let request =
            Request { credential: Some(credential.into()), ..order_claim("acct_1", &key, &body) };
        self.engine.claim(&request).await.unwrap()
    }

    pub(crate) async fn claim(&self, key_value: &str) -> Claim {
        self.claim_as("acct_1", key_value, &json!({"item": "book"})).await
    }

    pub(crate) async fn acquire(&self, key_value: &str) -> Lease {
        match self.claim(key_value).await {
            Claim::Acquired(lease) => lease,
            other => panic!("expected to acquire the key, got {other:?}"),
        }
    }

    pub(crate) fn operation(&self) -> PlaceOrder {
        PlaceOrder { shipper: self.shipper.clone(), pool: self.pool.clone() }
    }

    pub(crate) async fn run(&self, lease: Lease) -> Result<StoredResponse, Interrupted> {
        drive(&mut self.operation(), lease).await
    }

    /// Moves a key's lease into the past, as if its holder had stalled that long.
    pub(crate) async fn expire_lease(&self, key_value: &str) {
        sqlx::query("UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE idempotency_key = $1 AND locked_until IS NOT NULL")
            .bind(key_value)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    pub(crate) async fn recovery_point(&self, key_value: &str) -> String {
        sqlx::query_scalar("SELECT recovery_point FROM idempotency_keys WHERE idempotency_key = $1")
            .bind(key_value)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The shipment of the order under `key_value`.
    pub(crate) async fn shipment(&self, key_value: &str) -> Option<String> {
        sqlx::query_scalar(
            "SELECT shipment FROM orders o JOIN idempotency_keys k ON k.id = o.key_id \
              WHERE k.idempotency_key = $1",
        )
        .bind(key_value)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub(crate) async fn orders(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&self.pool).await.unwrap()
    }
}

/// Two live keys of acct_1 (`aa…`, `ee…`), one of acct_2 (`bb…`).
pub(crate) async fn accounts_with_keys(pool: &PgPool) {
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
