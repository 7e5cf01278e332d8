//! Idempotency keys done right: Leach-style atomic phases with recovery points in Postgres,
//! fenced leases, and stored responses.
//!
//! This crate knows nothing of payments or HTTP. An operation that must be safe to retry is
//! written as a state machine of **recovery points**; between two points runs either an **atomic
//! phase** (one database transaction that does local writes *and* moves the key to the next
//! point, or stores the final response) or a **foreign call** (no transaction open, no pooled
//! connection held), followed by a phase that records its result.
//!
//! # The key's life
//!
//! ```text
//!                    claim: a read of the key (one round trip, writes nothing)
//!                                        │
//!         ┌──────────────── absent ──────┴──────── exists ───────────────────────┐
//!         ▼                                                                      ▼
//!   leased at `started`, not stored yet;     fingerprint differs ─► 422 mismatch (row untouched)
//!   the first phase stores it (a duplicate   response stored     ─► replay it
//!   that read it absent too fails on the     lease active        ─► 409 in use
//!   unique index, and claims again)          lease free/expired  ─► take over (new token) ─┐
//!         │                                                                                 │
//!         ▼                                                                                 │
//!   phase ─► point ─► foreign call ─► phase ─► point … ─► phase ─► `finished` + response   │
//!     │  each phase commit is fenced:  WHERE owner_token = mine AND recovery_point = expected
//!     │  and must move exactly one row, or it rolls back (the lease was lost)
//!     ▼
//!   transient failure ─► release: same point, no owner, next_attempt_at = now() + back-off
//!                        a retry with the key (or the completer) resumes from that point ◄──┘
//! ```
//!
//! ```mermaid
//! stateDiagram-v2
//!     [*] --> Leased: first phase stores the new key
//!     Leased --> Leased: phase commit (fenced) to next recovery point
//!     Leased --> Released: transient failure
//!     Leased --> Expired: holder died or stalled
//!     Released --> Leased: retry or completer resumes
//!     Expired --> Leased: takeover with a new token
//!     Leased --> Finished: final phase stores the response
//!     Finished --> [*]: replayed until the reaper removes it
//! ```
//!
//! # A worked example
//!
//! A two-phase operation with a foreign call between its phases. The downstream key is derived
//! from a record the first phase committed, so every retry, takeover and completer run sends the
//! same one, and the other side does the work once.
//!
//! ```no_run
//! use idem::{Interrupted, Lease, Operation, RecoveryPoint, StoredResponse, TransientKind};
//! use sqlx::PgConnection;
//!
//! #[derive(Debug, Clone, Copy, PartialEq, Eq)]
//! enum Point { Started, OrderCreated }
//!
//! impl RecoveryPoint for Point {
//!     fn name(self) -> &'static str {
//!         match self { Point::Started => "started", Point::OrderCreated => "order_created" }
//!     }
//!     fn from_name(name: &str) -> Option<Self> {
//!         match name { "started" => Some(Point::Started), "order_created" => Some(Point::OrderCreated), _ => None }
//!     }
//! }
//!
//! struct PlaceOrder;
//!
//! async fn ship(downstream_key: String) -> Result<String, String> { Ok(format!("shipment for {downstream_key}")) }
//!
//! // The operation's writes: plain functions over a connection.
//! async fn create_order(tx: &mut PgConnection, key_id: i64) -> Result<(), sqlx::Error> {
//!     sqlx::query("INSERT INTO orders (idempotency_key_id) VALUES ($1)").bind(key_id).execute(tx).await?;
//!     Ok(())
//! }
//!
//! async fn record_shipment(tx: &mut PgConnection, key_id: i64, shipment: &str) -> Result<(), sqlx::Error> {
//!     sqlx::query("UPDATE orders SET shipment = $2 WHERE idempotency_key_id = $1")
//!         .bind(key_id).bind(shipment).execute(tx).await?;
//!     Ok(())
//! }
//!
//! impl Operation for PlaceOrder {
//!     type Point = Point;
//!
//!     async fn step(&mut self, lease: &mut Lease, at: Point) -> Result<(), Interrupted> {
//!         let key_id = lease.key_id();
//!         match at {
//!             // Phase 1: a local record, and the point "about to call".
//!             Point::Started => {
//!                 let mut tx = lease.begin().await?;
//!                 create_order(&mut tx, key_id).await?;
//!                 tx.commit_next(Point::OrderCreated).await?;
//!             }
//!             // The foreign call, outside any transaction, with a key derived from our record;
//!             // then phase 2 records its result and stores the final response.
//!             Point::OrderCreated => {
//!                 let shipment = ship(format!("order-{key_id}/ship")).await
//!                     .map_err(|detail| Interrupted::Transient { kind: TransientKind::Processor, detail })?;
//!                 let mut tx = lease.begin().await?;
//!                 record_shipment(&mut tx, key_id, &shipment).await?;
//!                 tx.commit_answer(StoredResponse::json(201, shipment.into_bytes())).await?;
//!             }
//!         }
//!         Ok(())
//!     }
//! }
//! ```
//!
//! A request then claims the key and, holding it, runs `idem::drive(&mut PlaceOrder, lease)` on a
//! task of its own (so that a client hanging up cannot cancel it halfway); the completer runs the
//! same `drive` on keys nobody finished.
//!
//! # Costs
//!
//! A replay, a mismatch and a key in use cost one statement (`read`), which can also check the
//! request's API key (`Request::credential`) on the way and writes nothing; it runs on
//! connections the engine keeps for it (`connections.rs`), which spares the pool's check of a
//! returned connection; so do one-statement phases, on connections of their own. A new key costs
//! that read and no commit of its own: its first phase stores it. A phase is one transaction
//! ([`FencedTx`]) with the caller's statements plus the fence (`idem_advance` or `idem_finish`,
//! one statement; a new key's first phase adds one more, the key's insert), or, on the fast path
//! ([`Lease::phase_in_one`]), a single statement of the caller's that calls the fence itself
//! (`idem_commit_fence`, with a [`FenceRecord`]).
//! Resuming costs one more statement (the compare-and-swap takeover).

pub mod batch;
mod connections;
mod engine;
mod error;
pub mod failpoint;
pub mod fingerprint;
pub mod inspect;
pub mod key;
mod observe;
mod response;
mod store;

pub use engine::{
    Claim, ClaimArgs, Due, Engine, EngineConfig, FINISHED, FencedTx, First, Interrupted, Lease,
    ONE_STATEMENT_TIMEOUT, Open, Operation, Read, Reaped, RecoveryPoint, Request, STARTED, Step,
    TransientKind, drive,
};
pub use error::{IdemError, PhaseError, is_retryable};
pub use failpoint::failpoint;
pub use fingerprint::{Fingerprint, RequestParts};
pub use key::{IdempotencyKey, KeyError};
pub use observe::{Event, NoObserver, Observer};
pub use response::StoredResponse;
pub use store::{Claimed, FenceRecord, StuckKey, stuck_keys, wake};
