//! `GET /healthz` (the process is alive) and `GET /readyz` (it can serve: the database answers and
//! its schema is at the version this binary was built for).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use utoipa_axum::routes;

use crate::app::AppState;
use crate::openapi::{ApiRouter, OK};

/// This module's routes: each handler's path and method are in its `#[utoipa::path]`.
pub fn routes(api: ApiRouter) -> ApiRouter {
    api.routes(routes!(healthz)).routes(routes!(readyz))
}

/// How long a readiness probe may wait for the database before it says "not ready".
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Liveness: answers as long as the process serves HTTP at all.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    summary = "The process is alive",
    responses((status = 200, description = OK, body = Object))
)]
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: 200 when the database answers and every migration this binary knows is applied.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    summary = "The database answers and the migrations are applied (503 otherwise)",
    responses(
        (status = 200, description = OK, body = Object),
        (status = 503, description = "The database does not answer or the schema is behind",
            body = Object),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let known: Vec<(i64, &[u8])> =
        crate::MIGRATOR.iter().map(|m| (m.version, m.checksum.as_ref())).collect();
    let expected = known.iter().map(|(version, _)| *version).max().unwrap_or(0);
    let checked = tokio::time::timeout(READY_TIMEOUT, schema(&state.pool, &known)).await;
    let (status, database, schema) = match checked {
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out", Schema::default()),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "readiness check could not reach the database");
            (StatusCode::SERVICE_UNAVAILABLE, "unreachable", Schema::default())
        }
        // A schema ahead of this binary is ready: migrations are applied before the release
        // that needs them starts (README, "Upgrading"), so the release still serving meets the
        // next one's migrations, and they only add what it does not use.
        Ok(Ok(schema)) if schema.version.is_some() && schema.missing == Some(0) => {
            (StatusCode::OK, "ok", schema)
        }
        Ok(Ok(schema)) => (StatusCode::SERVICE_UNAVAILABLE, "ok", schema),
    };
    let ready = status == StatusCode::OK;
    (
        status,
        Json(json!({
            "status": if ready { "ready" } else { "unavailable" },
            "checks": {
                "database": database,
                "schema_version": schema.version,
                "expected_schema_version": expected,
                "missing_migrations": schema.missing,
            }
        })),
    )
}

/// What the database's migrations table says about the migrations this binary knows.
#[derive(Debug, Default, sqlx::FromRow)]
struct Schema {
    /// The newest migration applied (this binary's, or a later release's), `None` when the
    /// database has never been migrated.
    version: Option<i64>,
    /// How many of this binary's migrations are not applied (successfully, with the same
    /// checksum: a migration edited since is not this binary's); `None` when the database did
    /// not say.
    missing: Option<i64>,
}

async fn schema(pool: &sqlx::PgPool, known: &[(i64, &[u8])]) -> Result<Schema, sqlx::Error> {
    // The migrations table may not exist yet on a fresh database; that is "not migrated", and
    // the statement must not name the table then (it would not plan).
    let migrated: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !migrated {
        return Ok(Schema { version: None, missing: Some(known.len() as i64) });
    }
    sqlx::query_as(
        "SELECT (SELECT max(version) FROM _sqlx_migrations WHERE success) AS version, \
                (SELECT count(*) FROM unnest($1::bigint[], $2::bytea[]) AS k(version, checksum) \
                  WHERE NOT EXISTS (SELECT 1 FROM _sqlx_migrations m \
                                     WHERE m.version = k.version AND m.checksum = k.checksum \
                                       AND m.success)) AS missing",
    )
    .bind(known.iter().map(|(version, _)| *version).collect::<Vec<i64>>())
    .bind(known.iter().map(|(_, checksum)| checksum.to_vec()).collect::<Vec<Vec<u8>>>())
    .fetch_one(pool)
    .await
}
