//! The edge holds (issue 17): control characters, bodies that are not objects, slow clients,
//! floods of bad keys, webhook bodies from anyone that trickle in, honest Retry-After, keyed
//! PATCH, and the rest of HTTP hygiene. Every answer to bad input is a problem, never a 5xx.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use payments_tests::proxy::Proxy;
use payments_tests::{TestApp, assert_problem, json, spawn_with_sim, start_sim, test_settings};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Asserts a final 4xx: a problem of this status and code, and no promise that a retry helps.
async fn assert_final(response: reqwest::Response, status: u16, code: &str) -> Value {
    assert!(
        !response.headers().contains_key("retry-after"),
        "a final {status} {code} carries no Retry-After"
    );
    assert_problem(response, status, code).await
}

async fn patch(app: &TestApp, key: &str, path: &str, body: &str) -> reqwest::Response {
    app.send(
        app.http
            .patch(app.url(path))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body.to_owned()),
    )
    .await
}

async fn create_payment(app: &TestApp, key: &str) -> Value {
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    let response = app.post("/v1/payments", key, Some(&uuid()), &body).await;
    assert_eq!(response.status(), 201);
    json(response).await
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn payment_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn nul_and_control_characters_are_invalid_requests_naming_the_field(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let base = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    let with = |member: &str, value: Value| {
        let mut body = base.clone();
        body[member] = value;
        body
    };
    let cases = [
        (with("description", json!("a\u{0}b")), "description"),
        (with("description", json!("bell\u{7}")), "description"),
        (with("description", json!("esc\u{1b}[31m")), "description"),
        (with("metadata", json!({"k\u{0}": "v"})), "metadata"),
        (with("metadata", json!({"k": "v\u{0}"})), "metadata"),
        (with("metadata", json!({"k\n": "v"})), "metadata"),
    ];
    for (body, param) in cases {
        let response = app.post("/v1/payments", &key, Some(&uuid()), &body).await;
        let problem = assert_final(response, 400, "invalid_request").await;
        assert_eq!(problem["param"], param, "{body}: {problem}");
    }
    assert_eq!(payment_count(&pool).await, 0, "nothing was stored");

    // Multi-line text is text.
    let multi_line = with("description", json!("line one\r\nline\ttwo"));
    let response = app.post("/v1/payments", &key, Some(&uuid()), &multi_line).await;
    assert_eq!(response.status(), 201);
    let payment = json(response).await;
    let id = payment["id"].as_str().unwrap();

    // Refunds and PATCH refuse them too.
    let refund = json!({"metadata": {"k": "a\u{0}b"}});
    let response =
        app.post(&format!("/v1/payments/{id}/refunds"), &key, Some(&uuid()), &refund).await;
    let problem = assert_final(response, 400, "invalid_request").await;
    assert_eq!(problem["param"], "metadata");
    for body in [r#"{"description":"a\u0000b"}"#, r#"{"metadata":{"a\u0000":null}}"#] {
        let problem = assert_final(
            patch(&app, &key, &format!("/v1/payments/{id}"), body).await,
            400,
            "invalid_request",
        )
        .await;
        assert!(["description", "metadata"].contains(&problem["param"].as_str().unwrap()));
    }

    // Ids and cursors are checked for their shape before any query.
    for path in ["/v1/payments/pay_a%00b", "/v1/payments/pay_%01", "/v1/refunds/re_%00"] {
        let problem = assert_final(app.get(path, &key).await, 404, "resource_missing").await;
        assert_eq!(problem["param"], "id", "{path}");
    }
    let response = patch(&app, &key, "/v1/payments/pay_a%00b", "{}").await;
    assert_final(response, 404, "resource_missing").await;
    let capture = app.post("/v1/payments/pay_a%00b/capture", &key, Some(&uuid()), &json!({})).await;
    assert_final(capture, 404, "resource_missing").await;
    for param in ["starting_after", "ending_before"] {
        for value in ["pay_a%00b", "pay_%0A", "pay_a%20b"] {
            let response = app.get(&format!("/v1/payments?{param}={value}"), &key).await;
            let problem = assert_final(response, 400, "invalid_request").await;
            assert_eq!(problem["param"], param);
        }
        let response = app.get(&format!("/v1/payments/{id}/refunds?{param}=re_%00"), &key).await;
        assert_final(response, 400, "invalid_request").await;
    }
    // A well-formed id that names nothing is a 404.
    let response = app.get("/v1/payments?starting_after=pay_doesnotexist", &key).await;
    assert_final(response, 404, "resource_missing").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_body_that_is_not_a_json_object_is_an_invalid_request(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    for body in
        [r#"[500,"usd","pm_card_visa"]"#, r#"[500,"usd","pm_card_visa","automatic"]"#, "500"]
    {
        let request = app
            .http
            .post(app.url("/v1/payments"))
            .bearer_auth(&key)
            .header("idempotency-key", uuid())
            .header("content-type", "application/json")
            .body(body);
        let problem = assert_final(app.send(request).await, 400, "invalid_request").await;
        assert_eq!(problem["param"], "body");
    }
    assert_eq!(payment_count(&pool).await, 0, "an array never became a payment");

    let payment = create_payment(&app, &key).await;
    let path = format!("/v1/payments/{}", payment["id"].as_str().unwrap());
    for body in [r#"["changed"]"#, "null", r#""x""#] {
        assert_final(patch(&app, &key, &path, body).await, 400, "invalid_request").await;
    }
}

/// Reads from a raw connection until the server closes it; `None` if it is still open after
/// `within`. Returns what was read.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut received = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| String::from_utf8_lossy(&received).into_owned())
}

async fn connect(app: &TestApp) -> TcpStream {
    let address: SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    TcpStream::connect(address).await.unwrap()
}

/// Timeouts short enough for a test, long enough that no healthy exchange meets them.
const SLOW_CLIENT_LIMITS: &[(&str, &str)] = &[
    ("PAYMENTS__HTTP__HEADER_READ_TIMEOUT_MS", "500"),
    ("PAYMENTS__HTTP__BODY_TIMEOUT_MS", "500"),
];

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn headers_begun_and_never_finished_are_cut_off(pool: PgPool) {
    let app = TestApp::spawn_with(pool.clone(), pool, SLOW_CLIENT_LIMITS).await;
    let mut stream = connect(&app).await;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
    let closed = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    assert!(closed.is_some(), "a connection whose headers never end is closed");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_idle_keep_alive_connection_is_closed(pool: PgPool) {
    let app = TestApp::spawn_with(pool.clone(), pool, SLOW_CLIENT_LIMITS).await;
    let mut stream = connect(&app).await;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let answer = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    let answer = answer.expect("the idle connection is closed after its answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_body_that_stalls_is_cut_off(pool: PgPool) {
    let app = TestApp::spawn_with(pool.clone(), pool, SLOW_CLIENT_LIMITS).await;
    let (_, key) = app.create_account("shop").await;
    let mut stream = connect(&app).await;
    let head = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Idempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    let answer = answer.expect("a connection whose body stalls is closed");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_client_that_stops_reading_its_answers_is_disconnected(pool: PgPool) {
    // Only the write bound is short: no other timer of the server could close the connection
    // within the test's wait.
    let limits = [
        ("PAYMENTS__HTTP__WRITE_TIMEOUT_MS", "300"),
        ("PAYMENTS__HTTP__HEADER_READ_TIMEOUT_MS", "60000"),
        ("PAYMENTS__HTTP__BODY_TIMEOUT_MS", "60000"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool, &limits).await;
    let address: SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(address).await.unwrap();
    // Pipelined requests for the OpenAPI document (tens of KB each), written on and on, and not
    // one answer read: the server's writes soon wait on a full socket. Once it drops the
    // connection, a write here fails (the server's kernel resets a connection closed with
    // requests it never read). Without the bound it never drops it: hyper holds the next request
    // until the answer before it is written, and no timer of its own runs meanwhile.
    let requests = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Err(err) = stream.write_all(&requests).await {
                return err;
            }
        }
    })
    .await;
    let err = ended.expect("the server closes the connection of a client that stopped reading");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted
        ),
        "{err:?}"
    );
    // Counted, which also shows that the server saw the stalled write behind hyper's error.
    // The count follows the close by a moment: wait for it, with a deadline.
    let counted = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let metrics = app.http.get(app.admin_url("/metrics"));
            let metrics = app.send(metrics).await.text().await.unwrap();
            let count = metrics
                .lines()
                .find_map(|line| line.strip_prefix("http_write_stalled_connections_total "))
                .map(|value| value.trim().parse::<f64>().unwrap());
            if count.is_some_and(|count| count >= 1.0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "the stalled connection is counted in /metrics");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_request_over_its_time_is_answered_503_with_retry_after(pool: PgPool) {
    let limits = [
        ("PAYMENTS__HTTP__REQUEST_TIMEOUT_MS", "500"),
        ("PAYMENTS__HTTP__BODY_TIMEOUT_MS", "60000"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool, &limits).await;
    let (_, key) = app.create_account("shop").await;
    let mut stream = connect(&app).await;
    let head = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Idempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buffer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await;
    let n = read.expect("an answer within the request timeout").unwrap();
    let answer = String::from_utf8_lossy(&buffer[..n]).to_lowercase();
    assert!(answer.starts_with("http/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("service_unavailable"), "{answer}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn requests_beyond_the_in_flight_bound_are_shed_with_503_and_retry_after(pool: PgPool) {
    // One request holds the only place while its charge takes a while (a body that trickles in
    // holds none: `fairness.rs`).
    let sim =
        start_sim(processor_sim::FaultConfig { latency_ms: 3000, ..Default::default() }).await;
    let limits = [
        ("PAYMENTS__HTTP__MAX_IN_FLIGHT_REQUESTS", "1"),
        ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool, &limits).await;
    let (_, key) = app.create_account("shop").await;
    let body =
        serde_json::json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    let request = app.http.post(app.url("/v1/payments")).bearer_auth(&key);
    let stream = tokio::spawn(request.header("idempotency-key", "k1").json(&body).send());
    let mut shed = None;
    for _ in 0..100 {
        let response = app.send(app.http.get(app.url("/healthz"))).await;
        if response.status() == 503 {
            shed = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let response = shed.expect("a request beyond the bound is shed");
    assert_eq!(response.headers()["retry-after"], "1");
    assert_problem(response, 503, "service_unavailable").await;
    assert_eq!(stream.await.unwrap().unwrap().status(), 201);
    // Once the place is free again, requests are served.
    let mut status = 0;
    for _ in 0..100 {
        status = app.send(app.http.get(app.url("/healthz"))).await.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200);
}

/// A client that keeps sending headers is refused once they pass `http.max_header_bytes`, at once,
/// not when the header timer runs out: until then every such connection held what it had sent
/// (hyper's own bound, its read buffer, is about 400 KB).
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn headers_past_the_bound_are_refused_at_once(pool: PgPool) {
    let timers = [("PAYMENTS__HTTP__HEADER_READ_TIMEOUT_MS", "60000")];
    let app = TestApp::spawn_with(pool.clone(), pool, &timers).await;
    let address: SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    request.extend(std::iter::repeat_n(b'a', 40_000));
    // No end of the headers: the client would go on.
    stream.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server waited for more headers");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_flood_of_unknown_keys_from_one_address_meets_429(pool: PgPool) {
    let limits = [
        ("PAYMENTS__RATE_LIMIT__PER_ADDRESS_PER_SECOND", "1"),
        ("PAYMENTS__RATE_LIMIT__PER_ADDRESS_BURST", "5"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool, &limits).await;
    let (_, key) = app.create_account("shop").await;
    // A live key seen once is not counted against its address afterwards.
    assert_eq!(app.get("/v1/payments", &key).await.status(), 200);
    let mut statuses = Vec::new();
    for i in 0..20 {
        let response = app.get("/v1/payments", &format!("sk_test_bogus{i}")).await;
        let status = response.status().as_u16();
        if status == 429 {
            assert!(response.headers().contains_key("retry-after"));
            assert_problem(response, 429, "rate_limited").await;
        } else {
            assert_final(response, 401, "invalid_api_key").await;
        }
        statuses.push(status);
    }
    assert!(statuses.iter().filter(|s| **s == 401).count() <= 5, "{statuses:?}");
    assert!(statuses.ends_with(&[429, 429, 429]), "{statuses:?}");
    assert_eq!(app.get("/v1/payments", &key).await.status(), 200, "the live key is not limited");
    // What costs no lookup is answered as it is, limited address or not: no key at all, and a
    // key found unknown a moment ago.
    let anonymous = app.send(app.http.get(app.url("/v1/payments"))).await;
    assert_final(anonymous, 401, "authentication_required").await;
    let again = app.get("/v1/payments", "sk_test_bogus0").await;
    assert_final(again, 401, "invalid_api_key").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_unknown_key_is_answered_again_without_a_database_lookup(pool: PgPool) {
    let options = pool.connect_options();
    let target: SocketAddr =
        format!("{}:{}", options.get_host(), options.get_port()).parse().unwrap();
    let proxy = Proxy::start(target).await.unwrap();
    let serving_pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy_with((*options).clone().host("127.0.0.1").port(proxy.port()));
    let app = TestApp::spawn_with(pool, serving_pool, &[]).await;
    let response = app.get("/v1/payments", "sk_test_unknown").await;
    assert_final(response, 401, "invalid_api_key").await;

    proxy.block();
    // The same unknown key: answered from memory.
    let response = app.get("/v1/payments", "sk_test_unknown").await;
    assert_final(response, 401, "invalid_api_key").await;
    // Another one needs the database, which is away: so the first answer was not a lookup.
    let response = app.get("/v1/payments", "sk_test_other").await;
    assert!(response.status().is_server_error(), "{}", response.status());
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_patch_with_a_key_is_replayed_and_never_undoes_a_later_change(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let payment = create_payment(&app, &key).await;
    let path = format!("/v1/payments/{}", payment["id"].as_str().unwrap());
    let keyed = |body: &str, media_type: &str, idempotency_key: &str| {
        app.http
            .patch(app.url(&path))
            .bearer_auth(&key)
            .header("idempotency-key", idempotency_key)
            .header("content-type", media_type)
            .body(body.to_owned())
    };
    let body = r#"{"description":"first","metadata":{"a":"1"}}"#;
    let first = app.send(keyed(body, "application/merge-patch+json", "p1")).await;
    assert_eq!(first.status(), 200);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let first_etag = first.headers()["etag"].clone();
    let first_bytes = first.bytes().await.unwrap();

    // Someone else changes the description.
    let other = patch(&app, &key, &path, r#"{"description":"someone else's"}"#).await;
    assert_eq!(other.status(), 200);

    // The retry replays the first answer, byte for byte, and changes nothing.
    let replay = app.send(keyed(body, "application/merge-patch+json; charset=utf-8", "p1")).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["etag"], first_etag);
    assert_eq!(replay.bytes().await.unwrap(), first_bytes);
    let now = json(app.get(&path, &key).await).await;
    assert_eq!(now["description"], "someone else's", "the retry did not undo the later change");
    assert_eq!(now["metadata"], json!({"a": "1"}));

    // The same key with another body, or the same body as another media type, is 422.
    let other_body =
        app.send(keyed(r#"{"description":"other"}"#, "application/merge-patch+json", "p1"));
    assert_final(other_body.await, 422, "idempotency_key_reused").await;
    let other_type = app.send(keyed(body, "application/json", "p1")).await;
    assert_final(other_type, 422, "idempotency_key_reused").await;

    // A stale If-Match is the key's answer too: replayed, not re-evaluated.
    let stale =
        keyed(r#"{"description":"x"}"#, "application/json", "p2").header("if-match", "\"0\"");
    assert_final(app.send(stale).await, 412, "precondition_failed").await;
    let again =
        keyed(r#"{"description":"x"}"#, "application/json", "p2").header("if-match", "\"0\"");
    let again = app.send(again).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.status(), 412);
    // The client re-reads the payment, as the 412 tells it to, and retries under the same key
    // with the right If-Match: that is another request, refused as such, not the stored 412.
    let current = app.get(&path, &key).await.headers()["etag"].clone();
    let corrected = keyed(r#"{"description":"x"}"#, "application/json", "p2")
        .header("if-match", current.clone());
    assert_final(app.send(corrected).await, 422, "idempotency_key_reused").await;
    // Under a new key it applies.
    let fresh =
        keyed(r#"{"description":"x"}"#, "application/json", "p2b").header("if-match", current);
    assert_eq!(app.send(fresh).await.status(), 200);

    // An unknown payment stores nothing for the key.
    let missing = app.http.patch(app.url("/v1/payments/pay_nothere")).bearer_auth(&key);
    let missing =
        missing.header("idempotency-key", "p3").header("content-type", "application/json");
    assert_final(app.send(missing.body("{}")).await, 404, "resource_missing").await;
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'p3'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 0);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn every_answer_says_no_store_and_a_401_says_how_to_authenticate(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    for response in [
        app.get("/v1/payments", &key).await,
        app.get("/v1/payments/pay_nothere", &key).await,
        app.get("/v1/payments", "sk_test_nope").await,
        app.send(app.http.get(app.url("/v1/payments"))).await,
        app.send(app.http.get(app.url("/healthz"))).await,
    ] {
        assert_eq!(response.headers()["cache-control"], "no-store", "{}", response.url());
    }
    for response in [
        app.get("/v1/payments", "sk_test_nope").await,
        app.send(app.http.get(app.url("/v1/payments"))).await,
        app.get("/v1/payments", "not-a-key").await,
    ] {
        let challenge = response.headers().get("www-authenticate").expect("a 401 has a challenge");
        assert!(challenge.to_str().unwrap().starts_with("Bearer"), "{challenge:?}");
        assert_eq!(response.status(), 401);
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_path_that_does_not_percent_decode_is_a_problem(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, key) = app.create_account("shop").await;
    for path in ["/v1/payments/%FF", "/v1/refunds/%C3%28", "/v1/payments/%FF/refunds"] {
        let response = app.get(path, &key).await;
        assert_final(response, 404, "resource_missing").await;
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_pool_runs_with_a_statement_timeout(pool: PgPool) {
    let url = payments_tests::system::database_url(&pool);
    let settings = test_settings(&[("DATABASE_URL", url.as_str())]);
    let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&settings.database.pool().unwrap())
        .await
        .unwrap();
    assert_eq!(timeout, "30s");
    let settings = test_settings(&[
        ("DATABASE_URL", url.as_str()),
        ("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "50"),
    ]);
    let slow = sqlx::query("SELECT pg_sleep(1)").execute(&settings.database.pool().unwrap()).await;
    let err = slow.expect_err("a statement over the timeout is cancelled");
    assert!(err.to_string().contains("statement timeout"), "{err}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn connections_beyond_the_bound_wait_until_one_closes(pool: PgPool) {
    let limits = [("PAYMENTS__HTTP__MAX_CONNECTIONS", "1")];
    let app = TestApp::spawn_with(pool.clone(), pool, &limits).await;
    let mut first = connect(&app).await;
    first.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buffer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), first.read(&mut buffer)).await;
    assert!(String::from_utf8_lossy(&buffer[..n.unwrap().unwrap()]).starts_with("HTTP/1.1 200"));

    // The first connection stays open (keep-alive): the second is not served meanwhile.
    let second = app.http.get(app.url("/healthz")).timeout(Duration::from_millis(500)).send();
    assert!(second.await.is_err(), "a connection beyond the bound waits");
    drop(first);
    let third = app.http.get(app.url("/healthz")).timeout(Duration::from_secs(10)).send();
    assert_eq!(third.await.unwrap().status(), 200, "served once the first connection closed");
}

/// Sends the head of `POST /webhooks/processor` (no API key, `signature` if any) and one byte of
/// a 100-byte body, then stalls: a body that trickles in from anyone.
async fn stall_a_webhook(app: &TestApp, signature: Option<&str>) -> TcpStream {
    let mut stream = connect(app).await;
    let signature = signature.map(|s| format!("Stripe-Signature: {s}\r\n")).unwrap_or_default();
    let head = format!(
        "POST /webhooks/processor HTTP/1.1\r\nHost: x\r\n{signature}\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// The first answer on a raw connection, if one comes within ten seconds.
async fn first_answer(stream: &mut TcpStream) -> Option<String> {
    let mut buffer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await;
    read.ok().map(|n| String::from_utf8_lossy(&buffer[..n.unwrap()]).into_owned())
}

fn unix_now() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(now.as_secs()).unwrap()
}

/// A stalled body may not trip any timeout while the test runs: what is checked is that it holds
/// no place, not that it is cut off in the end.
const ONE_PLACE_AND_PATIENT_BODIES: &[(&str, &str)] = &[
    ("PAYMENTS__HTTP__MAX_IN_FLIGHT_REQUESTS", "1"),
    ("PAYMENTS__HTTP__BODY_TIMEOUT_MS", "60000"),
];

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_webhook_body_that_trickles_in_while_the_route_is_off_is_answered_404_unread(
    pool: PgPool,
) {
    let app = TestApp::spawn_with(pool.clone(), pool, ONE_PLACE_AND_PATIENT_BODIES).await;
    let (_, key) = app.create_account("shop").await;
    let mut stalled = stall_a_webhook(&app, None).await;
    let answer = first_answer(&mut stalled).await.expect("answered without waiting for the body");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.contains("resource_missing"), "{answer}");
    // Its body never came, and the only place serves a paying client.
    for _ in 0..5 {
        assert_eq!(app.get("/v1/payments", &key).await.status(), 200);
    }
    drop(stalled);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn unsigned_webhook_bodies_that_trickle_in_take_no_place_from_api_requests(pool: PgPool) {
    let secret = "whsec_inbound_test";
    let settings = [
        // Two places: as many as there are stalled webhooks below, so that neither is shed at
        // the edge before it reaches its route.
        ("PAYMENTS__HTTP__MAX_IN_FLIGHT_REQUESTS", "2"),
        ("PAYMENTS__HTTP__BODY_TIMEOUT_MS", "60000"),
        ("PAYMENTS__PROCESSOR__WEBHOOK_SECRET", secret),
        ("PAYMENTS__PROCESSOR__WEBHOOK_MAX_UNVERIFIED", "1"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool.clone(), &settings).await;
    let (_, key) = app.create_account("shop").await;

    // What no body could make good is refused before the body is read.
    let old = format!("t={},v1=00", unix_now() - 301);
    for (signature, detail) in
        [(None, "missing"), (Some("v1=00"), "malformed"), (Some(old.as_str()), "tolerance")]
    {
        let mut stalled = stall_a_webhook(&app, signature).await;
        let answer = first_answer(&mut stalled).await.expect("refused without the body");
        assert!(answer.starts_with("HTTP/1.1 400"), "{signature:?}: {answer}");
        assert!(answer.contains("Stripe-Signature") && answer.contains(detail), "{answer}");
    }

    // A header anyone can write gets its body read, under the webhooks' own bound: of two
    // such bodies trickling in, one holds that bound's only place, the other is shed at once.
    let forged = format!("t={},v1=00", unix_now());
    let mut first = stall_a_webhook(&app, Some(&forged)).await;
    let mut second = stall_a_webhook(&app, Some(&forged)).await;
    let answer = tokio::select! {
        answer = first_answer(&mut first) => answer,
        answer = first_answer(&mut second) => answer,
    };
    let answer = answer.expect("a webhook beyond the webhooks' bound is shed at once");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.to_lowercase().contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("service_unavailable") && answer.contains("webhooks"), "{answer}");
    // The one still stalled holds none of the API's places: both serve paying clients.
    for _ in 0..5 {
        let (one, two) = tokio::join!(app.get("/v1/payments", &key), app.get("/v1/payments", &key));
        assert_eq!((one.status().as_u16(), two.status().as_u16()), (200, 200));
    }

    // Once it is gone, a delivery the processor signed is taken as before.
    drop((first, second));
    let event = serde_json::to_vec(&json!({"id": "evt_1", "object": "event",
        "type": "charge.succeeded", "created": unix_now(), "data": {"object": {"id": "ch_1",
        "object": "charge", "amount": 100, "currency": "usd", "captured": true, "paid": true,
        "status": "succeeded", "amount_captured": 100, "amount_refunded": 0, "refunded": false,
        "metadata": {"payment_id": "pay_not_ours"}}}}))
    .unwrap();
    let mut status = 0;
    for _ in 0..200 {
        let signature = provider::signature::sign(secret, unix_now(), &event);
        let request = app.http.post(app.url("/webhooks/processor"));
        let response =
            app.send(request.header("stripe-signature", signature).body(event.clone())).await;
        status = response.status().as_u16();
        if status == 200 {
            assert_eq!(json(response).await["outcome"], "unmatched");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200, "a signed delivery is taken once the webhooks' place is free");
}
