//! Limits per source (issue 39): what the per-address limit counts as one client. An IPv4
//! address, or an IPv6 /64; behind a trusted proxy, the client the proxy names, and never what a
//! client writes in a forwarding header itself. And the ceiling on lookups from all of them, and
//! the bound on a source's open connections.

use std::net::SocketAddr;
use std::time::Duration;

use payments_tests::{TestApp, assert_problem};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A per-address limit that a few lookups exhaust.
const TIGHT: [(&str, &str); 2] = [
    ("PAYMENTS__RATE_LIMIT__PER_ADDRESS_PER_SECOND", "1"),
    ("PAYMENTS__RATE_LIMIT__PER_ADDRESS_BURST", "3"),
];

/// The status of a lookup of a fresh bogus key, sent with `header` (a forwarding header).
async fn lookup(app: &TestApp, header: Option<(&str, &str)>) -> u16 {
    let key = format!("sk_test_bogus{}", uuid::Uuid::new_v4().simple());
    let mut request = app.http.get(app.url("/v1/payments")).bearer_auth(key);
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    let response = app.send(request).await;
    let status = response.status().as_u16();
    match status {
        429 => assert_problem(response, 429, "rate_limited").await,
        503 => {
            assert!(response.headers().contains_key("retry-after"));
            assert_problem(response, 503, "service_unavailable").await
        }
        _ => assert_problem(response, 401, "invalid_api_key").await,
    };
    status
}

/// Sends lookups, the `i`th with `header(i)`, until one is refused; fails if none is among many
/// more than the burst (the limit refills one a second: only requests taking a second each could
/// pass them all).
async fn exhaust(app: &TestApp, header: impl Fn(usize) -> Option<(String, String)>) {
    for i in 0..50 {
        let header = header(i);
        let header = header.as_ref().map(|(name, value)| (name.as_str(), value.as_str()));
        if lookup(app, header).await == 429 {
            return;
        }
    }
    panic!("fifty lookups from one source, and none was limited");
}

/// Whether the source of lookups sent with `header` is out of lookups: one of three in a row is
/// refused (the limit refills one a second, so one may pass just after a refusal).
async fn limited(app: &TestApp, header: Option<(&str, &str)>) -> bool {
    for _ in 0..3 {
        if lookup(app, header).await == 429 {
            return true;
        }
    }
    false
}

fn xff(value: String) -> Option<(String, String)> {
    Some(("x-forwarded-for".to_owned(), value))
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_forwarding_header_from_a_peer_that_is_not_a_trusted_proxy_is_ignored(pool: PgPool) {
    let app = TestApp::spawn_with(pool.clone(), pool, &TIGHT).await;
    // A fresh client in every request, as the headers say: it is still the one peer.
    exhaust(&app, |i| match i % 2 {
        0 => xff(format!("203.0.113.{i}")),
        _ => Some(("forwarded".to_owned(), format!("for=203.0.113.{i}"))),
    })
    .await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn behind_a_trusted_proxy_each_client_is_counted_as_itself(pool: PgPool) {
    let mut settings = TIGHT.to_vec();
    settings.push(("PAYMENTS__HTTP__TRUSTED_PROXIES", "127.0.0.0/8"));
    let app = TestApp::spawn_with(pool.clone(), pool, &settings).await;
    // What the client wrote before the proxy's own entry does not make it another client.
    exhaust(&app, |i| xff(format!("192.0.2.{i}, 203.0.113.1"))).await;
    assert!(limited(&app, Some(("x-forwarded-for", "203.0.113.1"))).await);
    // Another client behind the same proxy has a limit of its own, and so does the proxy.
    assert_eq!(lookup(&app, Some(("x-forwarded-for", "203.0.113.2"))).await, 401);
    assert_eq!(lookup(&app, None).await, 401);
    // A header that names no address: the request is the proxy's own.
    exhaust(&app, |_| None).await;
    assert!(limited(&app, Some(("x-forwarded-for", "unknown"))).await);
    assert_eq!(lookup(&app, Some(("x-forwarded-for", "203.0.113.3"))).await, 401);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_64_rotating_its_addresses_gets_one_bucket(pool: PgPool) {
    let mut settings = TIGHT.to_vec();
    settings.push(("PAYMENTS__HTTP__TRUSTED_PROXIES", "127.0.0.1"));
    settings.push(("PAYMENTS__HTTP__FORWARDED_HEADER", "forwarded"));
    let app = TestApp::spawn_with(pool.clone(), pool, &settings).await;
    let from =
        |address: String| Some(("forwarded".to_owned(), format!("for=\"[{address}]:4711\"")));
    exhaust(&app, |i| from(format!("2001:db8:0:1::{i:x}"))).await;
    assert!(limited(&app, Some(("forwarded", r#"for="[2001:db8:0:1:ab:cd:ef:1]""#))).await);
    // The next /64 is another source.
    assert_eq!(lookup(&app, Some(("forwarded", r#"for="[2001:db8:0:2::1]""#))).await, 401);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn lookups_from_many_addresses_meet_a_ceiling_that_live_keys_never_do(pool: PgPool) {
    let settings = [
        ("PAYMENTS__HTTP__TRUSTED_PROXIES", "127.0.0.1"),
        ("PAYMENTS__RATE_LIMIT__PER_ADDRESS_PER_SECOND", "1"),
        ("PAYMENTS__RATE_LIMIT__PER_ADDRESS_BURST", "1"),
        ("PAYMENTS__RATE_LIMIT__LOOKUPS_PER_SECOND", "3"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool, &settings).await;
    let (_, key) = app.create_account("shop").await;
    assert_eq!(app.get("/v1/payments", &key).await.status(), 200);
    // Every address within its own limit (one lookup each), and still the server refuses.
    let mut statuses = Vec::new();
    for i in 0..50 {
        let status = lookup(&app, Some(("x-forwarded-for", &format!("203.0.113.{i}")))).await;
        statuses.push(status);
        if status == 503 {
            break;
        }
    }
    assert_eq!(statuses.last(), Some(&503), "{statuses:?}");
    assert!(!statuses.contains(&429), "{statuses:?}");
    // A key known to be live needs no lookup: the ceiling is not its business.
    for _ in 0..5 {
        assert_eq!(app.get("/v1/payments", &key).await.status(), 200);
    }
}

/// A connection from `from` (any address of 127.0.0.0/8) to the app, on which one `/healthz`
/// was asked; `Err` with what came back when it was not answered.
async fn served(app: &TestApp, from: &str) -> Result<TcpStream, String> {
    let address: SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(address).await.unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    // A write to a connection the server closed may fail; the read then tells.
    let _ = stream.write_all(request).await;
    let mut head = [0; 12];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut head)).await;
    match read.expect("the server answers or closes within seconds") {
        Ok(n) if head[..n].starts_with(b"HTTP/1.1 200") => {
            // The rest of the answer, so that the connection waits for its next request.
            let mut rest = [0; 4096];
            let _ = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut rest)).await;
            Ok(stream)
        }
        Ok(n) => Err(String::from_utf8_lossy(&head[..n]).into_owned()),
        Err(err) => Err(err.to_string()),
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn one_source_holding_its_connections_open_leaves_room_for_the_others(pool: PgPool) {
    let settings = [("PAYMENTS__HTTP__MAX_CONNECTIONS_PER_SOURCE", "2")];
    let app = TestApp::spawn_with(pool.clone(), pool, &settings).await;
    let first = served(&app, "127.0.0.1").await.unwrap();
    let _second = served(&app, "127.0.0.1").await.unwrap();
    // Idle keep-alive connections, held: a third from the same host is closed unanswered.
    let refused = served(&app, "127.0.0.1").await.unwrap_err();
    assert!(!refused.starts_with("HTTP/"), "{refused}");
    // Another host is served.
    let _other = served(&app, "127.0.0.2").await.unwrap();
    // A connection that ends gives its place back.
    drop(first);
    payments_testkit::eventually("the place to be given back", Duration::from_secs(10), || async {
        served(&app, "127.0.0.1").await.is_ok()
    })
    .await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_trusted_proxy_is_not_held_to_the_bound_of_a_source(pool: PgPool) {
    let settings = [
        ("PAYMENTS__HTTP__MAX_CONNECTIONS_PER_SOURCE", "1"),
        ("PAYMENTS__HTTP__TRUSTED_PROXIES", "127.0.0.1"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool, &settings).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(served(&app, "127.0.0.1").await.unwrap());
    }
    let _one = served(&app, "127.0.0.3").await.unwrap();
    assert!(served(&app, "127.0.0.3").await.is_err());
}
