//! Support for the end-to-end tests: the real API on port 0 against a per-test database, an HTTP
//! client, and a TCP proxy that can cut the API off from Postgres.

pub mod invariants;
pub mod proxy;
pub mod system;

use std::sync::Once;

use payments_api::settings::LogSettings;
use payments_api::{Application, Settings};
use sqlx::PgPool;

/// Every client of a test connects from 127.0.0.1: the bound on connections per source would
/// refuse a test that opens many at once, so tests lift it to the bound on all connections
/// (tests of the bound itself set it again).
pub const ONE_ADDRESS: (&str, &str) = ("PAYMENTS__HTTP__MAX_CONNECTIONS_PER_SOURCE", "1024");

/// A running API server.
#[derive(Debug)]
pub struct TestApp {
    /// `http://127.0.0.1:{port}`
    pub address: String,
    /// The admin listener's, `http://127.0.0.1:{admin port}` (`/metrics`, readiness's checks).
    pub admin_address: String,
    /// The test database.
    pub pool: PgPool,
    /// A client with no default headers.
    pub http: reqwest::Client,
}

/// The key that seals webhook signing secrets in the tests (`webhooks.sealing_key`, which has no
/// default): 32 bytes of 0x5e.
pub const SEALING_KEY: (&str, &str) = (
    "PAYMENTS__WEBHOOKS__SEALING_KEY",
    "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e",
);

/// Settings for a test server: port 0 (and 0 for the admin listener), every connection of the
/// tests' one address allowed, the tests' sealing key, everything else the defaults, with
/// `overrides` applied (pairs of environment variable and value).
pub fn test_settings(overrides: &[(&str, &str)]) -> Settings {
    let mut env = vec![("PAYMENTS__HTTP__PORT".to_owned(), "0".to_owned())];
    env.push(("PAYMENTS__HTTP__ADMIN_PORT".to_owned(), "0".to_owned()));
    env.push((ONE_ADDRESS.0.to_owned(), ONE_ADDRESS.1.to_owned()));
    env.push((SEALING_KEY.0.to_owned(), SEALING_KEY.1.to_owned()));
    env.extend(overrides.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    match Settings::load_from(env) {
        Ok(settings) => settings,
        Err(err) => panic!("test settings are invalid: {err}"),
    }
}

impl TestApp {
    /// Starts the API on a free port over `pool`.
    pub async fn spawn(pool: PgPool) -> Self {
        Self::spawn_with(pool.clone(), pool, &[]).await
    }

    /// Starts the API whose handlers use `serving_pool` (which may reach the database through a
    /// proxy); `pool` stays a direct connection for the test's own checks.
    pub async fn spawn_with(
        pool: PgPool,
        serving_pool: PgPool,
        overrides: &[(&str, &str)],
    ) -> Self {
        init_logs();
        let app = match Application::build_with_pool(test_settings(overrides), serving_pool).await {
            Ok(app) => app,
            Err(err) => panic!("the app did not build: {err:#}"),
        };
        let address = format!("http://127.0.0.1:{}", app.port());
        let admin_address = format!("http://127.0.0.1:{}", app.admin_port());
        tokio::spawn(app.run_until(std::future::pending()));
        Self { address, admin_address, pool, http: reqwest::Client::new() }
    }

    /// `{address}{path}`
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `{admin_address}{path}`
    pub fn admin_url(&self, path: &str) -> String {
        format!("{}{path}", self.admin_address)
    }

    /// Creates an account; returns its id and secret key.
    pub async fn create_account(&self, name: &str) -> (String, String) {
        match payments_domain::accounts::create_account(&self.pool, name).await {
            Ok((account, _key, secret)) => (account.id.to_string(), secret.expose().to_owned()),
            Err(err) => panic!("could not create an account: {err}"),
        }
    }

    /// A GET with a Bearer key.
    pub async fn get(&self, path: &str, key: &str) -> reqwest::Response {
        self.send(self.http.get(self.url(path)).bearer_auth(key)).await
    }

    /// A DELETE with a Bearer key.
    pub async fn delete(&self, path: &str, key: &str) -> reqwest::Response {
        self.send(self.http.delete(self.url(path)).bearer_auth(key)).await
    }

    /// Sends a request, failing the test on a transport error.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> reqwest::Response {
        match request.send().await {
            Ok(response) => response,
            Err(err) => panic!("request failed: {err}"),
        }
    }
}

impl TestApp {
    /// A POST with a Bearer key, an optional Idempotency-Key and a JSON body.
    pub async fn post(
        &self,
        path: &str,
        key: &str,
        idempotency_key: Option<&str>,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        let mut request = self.http.post(self.url(path)).bearer_auth(key).json(body);
        if let Some(idempotency_key) = idempotency_key {
            request = request.header("idempotency-key", idempotency_key);
        }
        self.send(request).await
    }
}

/// Starts the stand-in processor on a free port; returns its base URL.
pub async fn start_sim(faults: processor_sim::FaultConfig) -> String {
    let simulator = match processor_sim::Simulator::build("127.0.0.1:0", faults).await {
        Ok(simulator) => simulator,
        Err(err) => panic!("the stand-in processor did not start: {err}"),
    };
    let url = format!("http://127.0.0.1:{}", simulator.port());
    tokio::spawn(simulator.run_until(std::future::pending()));
    url
}

/// Starts the API against a fresh stand-in processor; returns both.
pub async fn spawn_with_sim(pool: PgPool, overrides: &[(&str, &str)]) -> (TestApp, String) {
    let sim = start_sim(processor_sim::FaultConfig::default()).await;
    let mut all = vec![("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str())];
    all.extend_from_slice(overrides);
    (TestApp::spawn_with(pool.clone(), pool, &all).await, sim)
}

/// Reads a response as JSON, failing the test if it is not.
pub async fn json(response: reqwest::Response) -> serde_json::Value {
    match response.json().await {
        Ok(value) => value,
        Err(err) => panic!("the body is not JSON: {err}"),
    }
}

/// Checks that a response is a problem with the given status and code, in the documented shape;
/// returns the body for further checks.
pub async fn assert_problem(
    response: reqwest::Response,
    status: u16,
    code: &str,
) -> serde_json::Value {
    assert_eq!(response.status().as_u16(), status, "status of a `{code}` problem");
    let content_type =
        response.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_owned());
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    let request_id = response
        .headers()
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_default();
    let base = format!("http://{}", response.url().authority());
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = json(response).await;
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert_eq!(body["type"], format!("{base}/problems/{code}"), "{body}");
    if replayed {
        // A replayed problem keeps the first request's id; the header names this one.
        assert_ne!(body["request_id"], request_id.as_str());
        assert!(body["request_id"].as_str().is_some_and(|id| id.starts_with("req_")));
    } else {
        assert_eq!(body["request_id"], request_id.as_str(), "body and header name one request");
    }
    assert!(body["title"].as_str().is_some_and(|t| !t.is_empty()), "{body}");
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
    assert!(
        body.get("param").is_some(),
        "`param` is always present, null when not about one: {body}"
    );
    body
}

fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            payments_api::telemetry::init(&LogSettings {
                format: payments_api::settings::LogFormat::Pretty,
                filter: "debug,sqlx=warn,hyper=info".into(),
            });
        }
    });
}
