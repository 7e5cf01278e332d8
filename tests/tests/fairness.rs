//! One tenant cannot take the server from another (issue 39): a body is read holding no place
//! in flight, within a total deadline; an account holds at most its share of the places; and
//! requests without an API key meet a limit per address.

use std::time::{Duration, Instant};

use payments_tests::{TestApp, assert_problem, spawn_with_sim, start_sim};
use serde_json::json;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn payment() -> serde_json::Value {
    json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"})
}

/// A `POST /v1/payments` by `key` whose body stops after its first byte.
async fn slow_body(app: &TestApp, key: &str, idempotency_key: &str) -> TcpStream {
    let address = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Idempotency-Key: {idempotency_key}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// The first answer on a raw connection, if one comes within `wait`.
async fn answer_within(stream: &mut TcpStream, wait: Duration) -> Option<String> {
    let mut buffer = vec![0u8; 4096];
    let read = tokio::time::timeout(wait, stream.read(&mut buffer)).await;
    read.ok().map(|n| String::from_utf8_lossy(&buffer[..n.unwrap()]).into_owned())
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn bodies_that_trickle_in_from_one_account_take_no_place_from_another(pool: PgPool) {
    let settings = [
        ("PAYMENTS__HTTP__MAX_IN_FLIGHT_REQUESTS", "4"),
        // Patient enough that no body is cut off while the test runs.
        ("PAYMENTS__HTTP__BODY_TIMEOUT_MS", "60000"),
        ("PAYMENTS__HTTP__BODY_DEADLINE_MS", "60000"),
    ];
    let (app, _sim) = spawn_with_sim(pool, &settings).await;
    let (_, greedy) = app.create_account("greedy").await;
    let (_, other) = app.create_account("other").await;
    // Twice as many slow bodies as there are places, each reaching its body before the next
    // comes (requests that arrive together may find the places taken for the moment, and be
    // shed: that is the bound doing its work, not a body holding a place).
    let mut stalled = Vec::new();
    for i in 0..8 {
        stalled.push(slow_body(&app, &greedy, &format!("slow-{i}")).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..3 {
        let (idempotency_key, body) = (format!("other-{i}"), payment());
        let created = app.post("/v1/payments", &other, Some(&idempotency_key), &body).await;
        assert_eq!(created.status(), 201, "another account is served");
    }
    // None of the slow bodies was shed either: each waits for its body, holding no place.
    for stream in &mut stalled {
        assert_eq!(answer_within(stream, Duration::from_millis(50)).await, None);
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_body_gets_a_total_deadline_however_it_trickles(pool: PgPool) {
    let settings =
        [("PAYMENTS__HTTP__BODY_TIMEOUT_MS", "60000"), ("PAYMENTS__HTTP__BODY_DEADLINE_MS", "500")];
    let (app, _sim) = spawn_with_sim(pool, &settings).await;
    let (_, key) = app.create_account("shop").await;
    let started = Instant::now();
    let mut stream = slow_body(&app, &key, "slow").await;
    // A byte every 200 ms: no pause is long, the whole is.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if stream.write_all(b" ").await.is_err() {
            break;
        }
    }
    let answer = answer_within(&mut stream, Duration::from_secs(5)).await.expect("answered");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("did not arrive within 500 ms"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_account_holds_at_most_its_share_of_the_places_in_flight(pool: PgPool) {
    let sim =
        start_sim(processor_sim::FaultConfig { latency_ms: 1000, ..Default::default() }).await;
    let settings = [
        ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
        ("PAYMENTS__RATE_LIMIT__ACCOUNT_IN_FLIGHT", "2"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool, &settings).await;
    let (_, greedy) = app.create_account("greedy").await;
    let (_, other) = app.create_account("other").await;
    let send = |key: &str, idempotency_key: String| {
        let request = app.http.post(app.url("/v1/payments")).bearer_auth(key);
        request.header("idempotency-key", idempotency_key).json(&payment()).send()
    };
    // Three at once from one account: two are served, the third is told to wait.
    let (one, two, three, theirs) = tokio::join!(
        send(&greedy, "g-1".into()),
        send(&greedy, "g-2".into()),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            send(&greedy, "g-3".into()).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            send(&other, "o-1".into()).await
        },
    );
    assert_eq!((one.unwrap().status().as_u16(), two.unwrap().status().as_u16()), (201, 201));
    let three = three.unwrap();
    assert_eq!(three.headers()["retry-after"], "1");
    let problem = assert_problem(three, 429, "rate_limited").await;
    assert!(problem["detail"].as_str().unwrap().contains("in flight"), "{problem}");
    assert_eq!(theirs.unwrap().status(), 201, "another account has its own share");
    // Its places came back with its answers.
    assert_eq!(send(&greedy, "g-3".into()).await.unwrap().status(), 201);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn requests_without_an_api_key_meet_a_limit_per_address(pool: PgPool) {
    let settings = [
        ("PAYMENTS__RATE_LIMIT__ANONYMOUS_PER_SECOND", "1"),
        ("PAYMENTS__RATE_LIMIT__ANONYMOUS_BURST", "3"),
    ];
    let (app, _sim) = spawn_with_sim(pool, &settings).await;
    let (_, key) = app.create_account("shop").await;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(app.send(app.http.get(app.url("/healthz"))).await.status().as_u16());
    }
    assert_eq!(&statuses[..3], [200, 200, 200], "{statuses:?}");
    assert!(statuses[3..].contains(&429), "{statuses:?}");
    let limited = app.send(app.http.get(app.url("/openapi.json"))).await;
    assert_eq!(limited.headers()["retry-after"], "1");
    assert_problem(limited, 429, "rate_limited").await;
    // A caller with an API key is counted by its account's limits, not by this one.
    for _ in 0..5 {
        assert_eq!(app.get("/v1/payments", &key).await.status(), 200);
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_kept_alive_connection_idle_after_an_answer_is_closed_before_the_header_timeout(
    pool: PgPool,
) {
    let settings = [
        ("PAYMENTS__HTTP__IDLE_TIMEOUT_MS", "300"),
        ("PAYMENTS__HTTP__HEADER_READ_TIMEOUT_MS", "10000"),
    ];
    let (app, _sim) = spawn_with_sim(pool, &settings).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

    // Headers that trickle in, a pause longer than the idle bound between their bytes: a request
    // in progress is not idle.
    let mut busy = TcpStream::connect(&address).await.unwrap();
    busy.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    busy.write_all(b"Host: x\r\n\r\n").await.unwrap();
    let answer = answer_within(&mut busy, Duration::from_secs(5)).await.expect("answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // Kept alive after its answer, then idle: closed once the idle bound has passed.
    let mut idle = TcpStream::connect(&address).await.unwrap();
    idle.write_all(request).await.unwrap();
    let answer = answer_within(&mut idle, Duration::from_secs(5)).await.expect("answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let since = Instant::now();
    let closed = answer_within(&mut idle, Duration::from_secs(5)).await;
    assert_eq!(closed.as_deref(), Some(""), "the server closed the idle connection");
    assert!(since.elapsed() < Duration::from_secs(2), "closed after {:?}", since.elapsed());
}
