//! `GET /healthz` (the process is alive) and `GET /readyz` (it can serve: the database answers and
//! its schema is at the version this binary was built for). The public listener's `/readyz` says
//! only that, by its status, as a load balancer needs; what was checked (the database's state,
//! the schema's versions) is for operators, on the admin listener's `/readyz` (`crate::admin`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
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

/// Readiness: 200 `{"status":"ready"}` when the database answers and every migration this binary
/// knows is applied, else 503 `{"status":"unavailable"}`; the checks themselves are on the admin
/// listener ([`readyz_with_checks`]).
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
    let (status, body) = probe(&state).await;
    (status, Json(json!({ "status": body["status"] })))
}

/// The admin listener's `GET /readyz`: the public answer with what was checked (the database's
/// state, the schema's version, the version this binary expects, the migrations missing).
pub async fn readyz_with_checks(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let (status, body) = probe(&state).await;
    (status, Json(body))
}

/// The answer of the check under way, or of a new one: both listeners' probes share it.
async fn probe(state: &AppState) -> Probe {
    let pool = state.pool.clone();
    state.readiness.answer(|| async move { check(&pool).await }).await
}

/// Readiness probes that arrive while one checks the database share its check and its answer,
/// instead of each sending the database its two statements. A probe is unauthenticated and may
/// come from anyone: a flood of them keeps one check at a time in flight, each probe waiting for
/// the one under way (a few milliseconds while the database answers), instead of one connection
/// and up to [`READY_TIMEOUT`] per probe, which shed every other request. The check runs on a
/// task of its own, so it ends and answers even when the probe that started it hangs up (a
/// prober that gives up sooner than the check, during an outage); and no answer is older than
/// the probe that gets it: a probe that arrives after a check ended starts the next one.
#[derive(Debug, Default)]
pub struct Readiness {
    /// The check under way, or the last one.
    check: std::sync::Mutex<Option<Check>>,
}

/// A check, and whether it has ended (set by its task: a check whose probes all hung up ends
/// with nobody polling its answer, and must not be joined then).
#[derive(Debug)]
struct Check {
    answer: Shared<BoxFuture<'static, Probe>>,
    ended: Arc<AtomicBool>,
}

/// Marks a check ended when its task lets go of it.
struct Ended(Arc<AtomicBool>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A readiness answer: its status and body.
type Probe = (StatusCode, Value);

impl Readiness {
    /// The answer to a probe: the check under way's, or a new check's, which `check` starts.
    pub async fn answer<F, Fut>(&self, check: F) -> Probe
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Probe> + Send + 'static,
    {
        let shared = {
            let mut slot = self.check.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match &*slot {
                Some(running) if !running.ended.load(Ordering::Acquire) => running.answer.clone(),
                _ => {
                    let ended = Arc::new(AtomicBool::new(false));
                    let checking = check();
                    let task = tokio::spawn({
                        // Marked ended however the check ends: with an answer, a panic, or the
                        // runtime stopping.
                        let ended = Ended(ended.clone());
                        async move {
                            let _ended = ended;
                            checking.await
                        }
                    });
                    let answer = async move {
                        task.await.unwrap_or_else(|err| {
                            tracing::error!(error = %err, "the readiness check failed");
                            let failed = json!({ "status": "unavailable" });
                            (StatusCode::SERVICE_UNAVAILABLE, failed)
                        })
                    };
                    let answer = answer.boxed().shared();
                    *slot = Some(Check { answer: answer.clone(), ended });
                    answer
                }
            }
        };
        shared.await
    }
}

/// The database's answer, with this binary's migrations against the schema's.
async fn check(pool: &sqlx::PgPool) -> Probe {
    let known: Vec<(i64, &[u8])> =
        crate::MIGRATOR.iter().map(|m| (m.version, m.checksum.as_ref())).collect();
    let expected = known.iter().map(|(version, _)| *version).max().unwrap_or(0);
    let checked = tokio::time::timeout(READY_TIMEOUT, schema(pool, &known)).await;
    let (status, database, schema) = match checked {
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out", Schema::default()),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "readiness check could not reach the database");
            (StatusCode::SERVICE_UNAVAILABLE, "unreachable", Schema::default())
        }
        // A schema ahead of this binary is ready: migrations are applied before the release
        // that needs them starts (docs/reference/upgrading.md), so the release still serving
        // meets the next one's migrations, and they only add what it does not use.
        Ok(Ok(schema)) if schema.version.is_some() && schema.missing == Some(0) => {
            (StatusCode::OK, "ok", schema)
        }
        Ok(Ok(schema)) => (StatusCode::SERVICE_UNAVAILABLE, "ok", schema),
    };
    let ready = status == StatusCode::OK;
    (
        status,
        json!({
            "status": if ready { "ready" } else { "unavailable" },
            "checks": {
                "database": database,
                "schema_version": schema.version,
                "expected_schema_version": expected,
                "missing_migrations": schema.missing,
            }
        }),
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A check that counts its runs in `runs` and takes `pause`.
    fn counted(
        runs: &Arc<AtomicUsize>,
        pause: Duration,
    ) -> impl FnOnce() -> BoxFuture<'static, Probe> + use<> {
        let runs = runs.clone();
        move || {
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(pause).await;
                (StatusCode::OK, json!({ "run": n }))
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn probes_that_arrive_together_share_one_check() {
        let (readiness, runs) = (Arc::new(Readiness::default()), Arc::new(AtomicUsize::new(0)));
        let probes = (0..50).map(|_| {
            let (readiness, check) =
                (readiness.clone(), counted(&runs, Duration::from_millis(100)));
            tokio::spawn(async move { readiness.answer(check).await })
        });
        let answers = futures::future::join_all(probes).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "one check for fifty probes");
        for answer in answers {
            assert_eq!(answer.unwrap(), (StatusCode::OK, json!({ "run": 1 })));
        }
    }

    #[tokio::test]
    async fn a_probe_after_a_check_ended_checks_again() {
        let (readiness, runs) = (Readiness::default(), Arc::new(AtomicUsize::new(0)));
        for n in 1..=3 {
            let answer = readiness.answer(counted(&runs, Duration::ZERO)).await;
            assert_eq!(answer.1, json!({ "run": n }));
        }
    }

    #[tokio::test]
    async fn a_check_outlives_the_probe_that_hung_up_and_answers_the_next() {
        let (readiness, runs) = (Readiness::default(), Arc::new(AtomicUsize::new(0)));
        let cut = readiness.answer(counted(&runs, Duration::from_millis(200)));
        assert!(tokio::time::timeout(Duration::from_millis(20), cut).await.is_err());
        let answer = readiness.answer(counted(&runs, Duration::ZERO)).await;
        assert_eq!(answer.1, json!({ "run": 1 }), "the check under way answers");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_check_that_failed_is_not_answered_again() {
        let (readiness, runs) = (Readiness::default(), Arc::new(AtomicUsize::new(0)));
        let failed = readiness.answer(|| async { panic!("the check broke") }.boxed()).await;
        assert_eq!(failed.0, StatusCode::SERVICE_UNAVAILABLE);
        let answer = readiness.answer(counted(&runs, Duration::ZERO)).await;
        assert_eq!(answer, (StatusCode::OK, json!({ "run": 1 })), "the next probe checks anew");
    }

    #[tokio::test]
    async fn a_check_that_ended_while_nobody_waited_is_not_answered_again() {
        let (readiness, runs) = (Readiness::default(), Arc::new(AtomicUsize::new(0)));
        let cut = readiness.answer(counted(&runs, Duration::from_millis(50)));
        assert!(tokio::time::timeout(Duration::from_millis(10), cut).await.is_err());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = readiness.answer(counted(&runs, Duration::ZERO)).await;
        assert_eq!(answer.1, json!({ "run": 2 }), "a probe after the check ended checks anew");
    }
}
