//! An idempotent webhook receiver: verifies each delivery's signature, and records its event id
//! in its own table inside the same transaction as its effect, so a redelivery changes nothing.
//!
//! Run it beside `make run` (docs/reference/local-webhooks.md), with a database of its own,
//! which it creates if missing:
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/receiver WEBHOOK_SECRET=whsec_… PORT=4242 \
//!     cargo run -p payments-client --example webhook_receiver
//! ```
//!
//! Its effect is deliberately countable: each applied event adds one to its object's
//! `events_applied`, so a redelivery that slipped past the dedupe would show as a double count.
//! The end-to-end tests (`tests/tests/webhooks.rs`) run this very file.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use payments_client::webhooks::{self, SIGNATURE_HEADER};
use sqlx::migrate::MigrateDatabase;
use sqlx::{PgPool, Postgres};

/// What the handler needs.
#[derive(Clone)]
pub struct Receiver {
    /// The receiver's own database.
    pub pool: PgPool,
    /// The endpoint's `whsec_…`, as the API showed it once. Never printed.
    pub secret: String,
    /// How far a delivery's timestamp may be from now.
    pub tolerance: Duration,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").field("tolerance", &self.tolerance).finish_non_exhaustive()
    }
}

/// Creates the receiver's two tables, if missing.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS receiver_processed_events (
             event_id text PRIMARY KEY,
             type text NOT NULL,
             received_at timestamptz NOT NULL DEFAULT now()
         );
         CREATE TABLE IF NOT EXISTS receiver_objects (
             object_id text PRIMARY KEY,
             last_status text,
             events_applied integer NOT NULL
         );",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// `POST /webhooks`
pub fn router(receiver: Receiver) -> Router {
    Router::new().route("/webhooks", post(receive)).with_state(receiver)
}

async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let Some(header) = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, format!("no {SIGNATURE_HEADER} header"));
    };
    // Verified before anything is read or recorded: a bad signature, a replayed timestamp or a
    // body that is no event is a 400, and nothing is written.
    let event = match webhooks::verify(&body, header, &receiver.secret, receiver.tolerance) {
        Ok(event) => event,
        Err(err) => return (StatusCode::BAD_REQUEST, err.to_string()),
    };
    match apply(&receiver.pool, &event).await {
        Ok(true) => (StatusCode::OK, "applied".into()),
        Ok(false) => (StatusCode::OK, "already applied".into()),
        // Not a 2xx: the sender retries later, and the rolled-back transaction recorded nothing.
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    }
}

/// Records the event id and applies its effect in one transaction; false when the id was
/// recorded before (a redelivery), in which case nothing changes.
pub async fn apply(pool: &PgPool, event: &webhooks::Event) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let first = sqlx::query(
        "INSERT INTO receiver_processed_events (event_id, type) VALUES ($1, $2)
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(&event.id)
    .bind(&event.event_type)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !first {
        return Ok(false); // the transaction rolls back: nothing was written
    }
    let object = &event.data["object"];
    sqlx::query(
        "INSERT INTO receiver_objects (object_id, last_status, events_applied) VALUES ($1, $2, 1)
         ON CONFLICT (object_id) DO UPDATE
            SET last_status = EXCLUDED.last_status,
                events_applied = receiver_objects.events_applied + 1",
    )
    .bind(object["id"].as_str().unwrap_or("unknown"))
    .bind(object["status"].as_str())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

#[allow(dead_code)] // run as an example; the tests include this file as a module
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let secret = std::env::var("WEBHOOK_SECRET").map_err(|_| "set WEBHOOK_SECRET (whsec_…)")?;
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(4242);
    if !Postgres::database_exists(&url).await? {
        Postgres::create_database(&url).await?;
    }
    let pool = PgPool::connect(&url).await?;
    migrate(&pool).await?;
    let receiver = Receiver { pool, secret, tolerance: webhooks::DEFAULT_TOLERANCE };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("webhook receiver on http://127.0.0.1:{port}/webhooks");
    axum::serve(listener, router(receiver)).await?;
    Ok(())
}
