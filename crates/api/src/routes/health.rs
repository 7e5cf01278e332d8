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
    let expected = crate::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied = tokio::time::timeout(READY_TIMEOUT, applied_version(&state.pool)).await;
    let (status, database, schema) = match applied {
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out", None),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "readiness check could not reach the database");
            (StatusCode::SERVICE_UNAVAILABLE, "unreachable", None)
        }
        Ok(Ok(version)) if version == Some(expected) => (StatusCode::OK, "ok", version),
        Ok(Ok(version)) => (StatusCode::SERVICE_UNAVAILABLE, "ok", version),
    };
    let ready = status == StatusCode::OK;
    (
        status,
        Json(json!({
            "status": if ready { "ready" } else { "unavailable" },
            "checks": {
                "database": database,
                "schema_version": schema,
                "expected_schema_version": expected,
            }
        })),
    )
}

async fn applied_version(pool: &sqlx::PgPool) -> Result<Option<i64>, sqlx::Error> {
    // The migrations table may not exist yet on a fresh database; that is "not migrated".
    sqlx::query_scalar(
        "SELECT CASE WHEN to_regclass('_sqlx_migrations') IS NULL THEN NULL \
         ELSE (SELECT max(version) FROM _sqlx_migrations WHERE success) END",
    )
    .fetch_one(pool)
    .await
}
