//! The HTTP side of the engine, through a real server with the real edge: key validation,
//! replays, refusals, transient failures, and work that outlives a client who hung up.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use idem::{
    Engine, EngineConfig, Interrupted, Lease, NoObserver, Operation, RecoveryPoint, StoredResponse,
    TransientKind,
};
use payments_api::ApiError;
use payments_api::edge::{self, EdgeConfig};
use payments_api::extract::JsonBody;
use payments_api::idempotency::{Keyed, RequestMeta, RequiredKey, Runner};
use payments_domain::AccountId;
use payments_testkit::{WAIT, eventually};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Started,
    ThingCreated,
}

impl RecoveryPoint for Point {
    fn name(self) -> &'static str {
        match self {
            Point::Started => "started",
            Point::ThingCreated => "thing_created",
        }
    }
    fn from_name(name: &str) -> Option<Self> {
        [Point::Started, Point::ThingCreated].into_iter().find(|p| p.name() == name)
    }
}

/// Inserts a thing, waits at a gate that stands for a foreign call (which may fail), then
/// answers 201.
struct MakeThing {
    gate: watch::Receiver<bool>,
    failures: Arc<AtomicUsize>,
}

impl Operation for MakeThing {
    type Point = Point;

    async fn step(&mut self, lease: &mut Lease, at: Point) -> Result<(), Interrupted> {
        let key_id = lease.key_id();
        match at {
            Point::Started => {
                let mut tx = lease.begin().await?;
                sqlx::query("INSERT INTO things (key_id) VALUES ($1)")
                    .bind(key_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit_next(Point::ThingCreated).await?;
            }
            Point::ThingCreated => {
                let _ = self.gate.clone().wait_for(|open| *open).await;
                if self.failures.load(Ordering::SeqCst) > 0 {
                    self.failures.fetch_sub(1, Ordering::SeqCst);
                    return Err(Interrupted::Transient {
                        kind: TransientKind::Processor,
                        detail: "downstream unavailable".into(),
                    });
                }
                let mut tx = lease.begin().await?;
                let id: i64 = sqlx::query_scalar("SELECT id FROM things WHERE key_id = $1")
                    .bind(key_id)
                    .fetch_one(&mut *tx)
                    .await?;
                let body = json!({"id": id, "object": "thing"}).to_string();
                let answer = StoredResponse::json(201, body.into_bytes())
                    .with_header("location", format!("/things/{id}"));
                tx.commit_answer(answer).await?;
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
struct TestState {
    runner: Runner,
    gate: watch::Receiver<bool>,
    failures: Arc<AtomicUsize>,
}

async fn create_thing(
    State(state): State<TestState>,
    meta: RequestMeta,
    RequiredKey(key): RequiredKey,
    body: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let account = AccountId::parse("acct_test").expect("a well-formed account id");
    let keyed = Keyed { account: &account, credential: None, key: &key, meta: &meta, body: &body };
    let request = keyed.request_for("things.create", body.value.clone())?;
    let operation = MakeThing { gate: state.gate.clone(), failures: state.failures.clone() };
    state.runner.run(request, operation).await
}

struct Server {
    url: String,
    pool: PgPool,
    http: reqwest::Client,
    gate: watch::Sender<bool>,
    failures: Arc<AtomicUsize>,
}

async fn serve(pool: PgPool) -> Server {
    sqlx::query(
        "CREATE TABLE things (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         key_id bigint NOT NULL UNIQUE REFERENCES idempotency_keys (id))",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (gate, gate_rx) = watch::channel(true);
    let failures = Arc::new(AtomicUsize::new(0));
    let engine = Engine::new(
        pool.clone(),
        EngineConfig { lease: Duration::from_secs(30), ..EngineConfig::default() },
        Arc::new(NoObserver),
    );
    let state = TestState {
        runner: Runner::new(engine, TaskTracker::new()),
        gate: gate_rx,
        failures: failures.clone(),
    };
    let router = Router::new().route("/things", post(create_thing)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = edge::wrap(
        router,
        EdgeConfig {
            public_base_url: url.clone().into(),
            body_limit_bytes: 4096,
            limits: payments_api::edge::EdgeLimits::unbounded(),
            proxies: Default::default(),
        },
    );
    tokio::spawn(async move { axum::serve(listener, router).await });
    Server { url, pool, http: reqwest::Client::new(), gate, failures }
}

impl Server {
    fn post(&self, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(format!("{}/things", self.url))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request
    }

    async fn things(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM things").fetch_one(&self.pool).await.unwrap()
    }

    async fn recovery_point(&self) -> Option<String> {
        sqlx::query_scalar("SELECT recovery_point FROM idempotency_keys")
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }
}

async fn code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_missing_or_malformed_key_is_refused_and_nothing_is_stored(pool: PgPool) {
    let server = serve(pool).await;
    let missing = server.post(None, "{}").send().await.unwrap();
    assert_eq!(code(missing).await, (400, "idempotency_key_missing".into()));
    for bad in ["\"unterminated", "has space", "\"\""] {
        let response = server.post(Some(bad), "{}").send().await.unwrap();
        assert_eq!(code(response).await, (400, "idempotency_key_invalid".into()), "{bad}");
    }
    let twice = server.post(Some("k"), "{}").header("idempotency-key", "k").send().await.unwrap();
    assert_eq!(code(twice).await, (400, "idempotency_key_invalid".into()));
    assert_eq!(server.recovery_point().await, None);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_completed_key_replays_the_same_status_body_and_headers(pool: PgPool) {
    let server = serve(pool).await;
    let first = server.post(Some("k1"), r#"{"a":1,"b":[1,2]}"#).send().await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_location = first.headers()["location"].clone();
    let first_request_id = first.headers()["request-id"].clone();
    let first_body = first.bytes().await.unwrap();

    // Reformatted and reordered JSON is the same request; the quoted key is the same key.
    let replay = server.post(Some("\"k1\""), "{ \"b\": [1, 2],\n \"a\": 1 }").send().await.unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"], first_location);
    assert_eq!(replay.headers()["content-type"], "application/json");
    assert_ne!(replay.headers()["request-id"], first_request_id, "a replay is a new request");
    assert_eq!(replay.bytes().await.unwrap(), first_body);
    assert_eq!(server.things().await, 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn another_body_or_query_with_the_key_is_unprocessable(pool: PgPool) {
    let server = serve(pool).await;
    assert_eq!(server.post(Some("k1"), r#"{"a":1}"#).send().await.unwrap().status(), 201);
    let other_body = server.post(Some("k1"), r#"{"a":2}"#).send().await.unwrap();
    assert_eq!(code(other_body).await, (422, "idempotency_key_reused".into()));
    let other_query = server
        .http
        .post(format!("{}/things?x=1", server.url))
        .header("content-type", "application/json")
        .header("idempotency-key", "k1")
        .body(r#"{"a":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(code(other_query).await, (422, "idempotency_key_reused".into()));
    assert_eq!(server.things().await, 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_key_in_flight_answers_409_with_retry_after(pool: PgPool) {
    let server = Arc::new(serve(pool).await);
    server.gate.send_replace(false);
    let first = tokio::spawn({
        let server = server.clone();
        async move { server.post(Some("k1"), "{}").send().await.unwrap() }
    });
    let at_the_gate =
        || async { server.recovery_point().await.as_deref() == Some("thing_created") };
    eventually("the first request to wait at its foreign call", WAIT, at_the_gate).await;
    let second = server.post(Some("k1"), "{}").send().await.unwrap();
    assert_eq!(second.headers()["retry-after"], "1");
    assert_eq!(code(second).await, (409, "idempotency_key_in_use".into()));

    server.gate.send_replace(true);
    assert_eq!(first.await.unwrap().status(), 201);
}

#[sqlx::test(migrations = "../../migrations")]
async fn the_work_finishes_after_the_client_hangs_up(pool: PgPool) {
    let server = serve(pool).await;
    server.gate.send_replace(false);
    let hung_up = server.post(Some("k1"), "{}").timeout(Duration::from_millis(300)).send().await;
    assert!(hung_up.unwrap_err().is_timeout());

    // The client is gone; the operation is still waiting at its foreign call.
    server.gate.send_replace(true);
    let finished = || async { server.recovery_point().await.as_deref() == Some("finished") };
    eventually("the operation to finish without its client", WAIT, finished).await;
    assert_eq!(server.recovery_point().await.as_deref(), Some("finished"));
    let retry = server.post(Some("k1"), "{}").send().await.unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(server.things().await, 1);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_transient_failure_is_not_stored_and_the_retry_resumes(pool: PgPool) {
    let server = serve(pool).await;
    server.failures.store(1, Ordering::SeqCst);
    let failed = server.post(Some("k1"), "{}").send().await.unwrap();
    assert_eq!(failed.headers()["retry-after"], "1");
    assert_eq!(code(failed).await, (503, "processor_unavailable".into()));
    assert_eq!(server.recovery_point().await.as_deref(), Some("thing_created"));
    let unlocked: bool = sqlx::query_scalar(
        "SELECT owner_token IS NULL AND response_status IS NULL FROM idempotency_keys",
    )
    .fetch_one(&server.pool)
    .await
    .unwrap();
    assert!(unlocked, "released at its recovery point, nothing stored");

    let retry = server.post(Some("k1"), "{}").send().await.unwrap();
    assert_eq!(retry.status(), 201);
    assert!(
        retry.headers().get("idempotent-replayed").is_none(),
        "the retry ran, it did not replay"
    );
    assert_eq!(server.things().await, 1, "resumed after the insert, not from the start");
}
