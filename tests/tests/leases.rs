//! Leases that hold under hang-ups, stuck transactions and deploys (issue #16): no key is left
//! leased to nobody, and no claim waits without a deadline.
//!
//! The hang-up tests run the real `payments-api` binary with failpoints that stall right after
//! the database granted a lease; the others run the API in this process.

use std::time::{Duration, Instant};

use payments_api::Application;
use payments_tests::system::{Account, System, database_url, scale};
use payments_tests::{TestApp, spawn_with_sim, start_sim, test_settings};
use serde_json::{Value, json};
use sqlx::{Connection as _, PgPool};

fn payment_body() -> Value {
    json!({"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa"})
}

/// How long the failpoints hold a claim after the database granted its lease.
const STALL_MS: u64 = 1500;

/// Retries `key` at once and again until the answer is not `409`; returns that answer and how
/// long the `409`s lasted.
async fn retry_through_409s(
    sys: &System,
    api: &str,
    account: &Account,
    key: &str,
) -> ((u16, Vec<u8>), Duration) {
    let started = Instant::now();
    loop {
        let answer = sys
            .post(api, account, "/v1/payments", key, &payment_body(), Duration::from_secs(10))
            .await
            .expect("the retry is answered");
        if answer.0 != 409 {
            return (answer, started.elapsed());
        }
        // Well below the lease (60 s): a lease left to nobody would show as 409s until then.
        assert!(started.elapsed() < Duration::from_secs(10), "409 for {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_client_that_hangs_up_during_the_claim_or_the_takeover_costs_no_409_beyond_the_hang_up(
    pool: PgPool,
) {
    let sys = System::start(pool).await;
    let api = sys
        .api(&format!(
            "idem.claim.inserted=sleep({STALL_MS});idem.claim.taken_over=sleep({STALL_MS})"
        ))
        .await;
    let account = sys.account("shop").await;

    // A new key: the client hangs up while its claim holds the fresh lease.
    let hung = sys
        .post(
            &api.url,
            &account,
            "/v1/payments",
            "new",
            &payment_body(),
            Duration::from_millis(300),
        )
        .await;
    assert!(hung.is_none(), "the client hung up: {hung:?}");
    assert!(api.wait_for("FAILPOINT idem.claim.inserted", Duration::from_secs(5)).await);
    let ((status, _), waited) = retry_through_409s(&sys, &api.url, &account, "new").await;
    assert_eq!(status, 201, "the claim's task ran the payment");
    assert!(waited < Duration::from_millis(STALL_MS + 3000), "409s for {waited:?}");

    // A released key: the client hangs up while its takeover holds the lease.
    sys.faults(json!({"error_rate": 1.0})).await;
    let (status, _) = sys
        .post(
            &api.url,
            &account,
            "/v1/payments",
            "resumed",
            &payment_body(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(status, 503, "the processor failed, the key was released");
    sys.faults(json!({})).await;
    let hung = sys
        .post(
            &api.url,
            &account,
            "/v1/payments",
            "resumed",
            &payment_body(),
            Duration::from_millis(300),
        )
        .await;
    assert!(hung.is_none(), "the client hung up: {hung:?}");
    assert!(api.wait_for("FAILPOINT idem.claim.taken_over", Duration::from_secs(5)).await);
    let ((status, _), waited) = retry_through_409s(&sys, &api.url, &account, "resumed").await;
    assert_eq!(status, 201, "the takeover's task ran the payment");
    assert!(waited < Duration::from_millis(STALL_MS + 3000), "409s for {waited:?}");

    assert_eq!(sys.sim_stats().await["charges_created"], 2, "one charge per key");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_key_row_held_by_a_stuck_transaction_blocks_no_other_accounts_claims(pool: PgPool) {
    let (app, _sim) =
        spawn_with_sim(pool.clone(), &[("PAYMENTS__IDEMPOTENCY__CLAIM_TIMEOUT_MS", "500")]).await;
    let (_, stuck) = app.create_account("stuck").await;
    let (_, other) = app.create_account("other").await;
    let created = app.post("/v1/payments", &stuck, Some("held"), &payment_body()).await;
    assert_eq!(created.status(), 201);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let create = |name: String| {
        let request = http
            .post(app.url("/v1/payments"))
            .bearer_auth(&other)
            .header("idempotency-key", name)
            .json(&payment_body());
        async move {
            let started = Instant::now();
            let response = request.send().await.expect("another account's payment is answered");
            (response.status().as_u16(), started.elapsed())
        }
    };
    // The other account's normal latency, on this machine, at this concurrency.
    let payments = 10 * scale();
    let normal = futures::future::join_all((0..payments).map(|n| create(format!("before-{n}"))))
        .await
        .into_iter()
        .map(|(status, took)| {
            assert_eq!(status, 201);
            took
        })
        .max()
        .unwrap();

    // A transaction updated the key's row and neither commits nor rolls back (a phase stuck
    // between its update and its commit, an operator's open session).
    let mut stuck_tx = pool.begin().await.unwrap();
    sqlx::query("UPDATE idempotency_keys SET last_run_at = now() WHERE idempotency_key = 'held'")
        .execute(&mut *stuck_tx)
        .await
        .unwrap();

    // More retries of that key than there are claim connections, and another account's payments.
    let retry = |_| {
        let request = http
            .post(app.url("/v1/payments"))
            .bearer_auth(&stuck)
            .header("idempotency-key", "held")
            .json(&payment_body());
        async move { request.send().await.expect("a retry of the held key is answered") }
    };
    let (retries, creates) = tokio::join!(
        futures::future::join_all((0..16).map(retry)),
        futures::future::join_all((0..payments).map(|n| create(format!("during-{n}")))),
    );
    // The claim is a read, which takes no row lock: the retries of the held key get its stored
    // answer without waiting for the transaction.
    for response in retries {
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["idempotent-replayed"], "true");
    }
    for (status, took) in creates {
        assert_eq!(status, 201);
        // At most two rounds of claim connections held by the claim timeout (500 ms), beyond its normal time.
        let bound = normal + Duration::from_millis(2 * 500 + 500);
        assert!(took < bound, "another account's payment took {took:?} (normally {normal:?})");
    }

    // Once the transaction ends, the key answers as before.
    stuck_tx.rollback().await.unwrap();
    let replay = app.post("/v1/payments", &stuck, Some("held"), &payment_body()).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_takeover_behind_a_transaction_holding_the_key_row_gives_up_in_time(pool: PgPool) {
    let sys = System::start(pool.clone()).await;
    let api = sys.api("idem.claim.before_take_over=sleep(1000)").await;
    let account = sys.account("shop").await;
    sys.faults(json!({"error_rate": 1.0})).await;
    let (status, _) = sys
        .post(&api.url, &account, "/v1/payments", "k", &payment_body(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(status, 503, "the processor failed, the key was released");
    sys.faults(json!({})).await;
    let attempts_before: i32 =
        sqlx::query_scalar("SELECT attempts FROM idempotency_keys").fetch_one(&pool).await.unwrap();

    // The retry reads the free key; before it takes it over, a transaction updates the row and
    // stays open.
    let retry = {
        let (http, url, secret) = (sys.http.clone(), api.url.clone(), account.secret.clone());
        tokio::spawn(async move {
            let response = http
                .post(format!("{url}/v1/payments"))
                .bearer_auth(secret)
                .header("idempotency-key", "k")
                .json(&payment_body())
                .send()
                .await
                .expect("the retry is answered");
            let retry_after = response.headers().contains_key("retry-after");
            (response.status().as_u16(), retry_after, response.json::<Value>().await.unwrap())
        })
    };
    assert!(api.wait_for("FAILPOINT idem.claim.before_take_over", Duration::from_secs(5)).await);
    let mut stuck_tx = pool.begin().await.unwrap();
    sqlx::query("UPDATE idempotency_keys SET last_run_at = now() WHERE idempotency_key = 'k'")
        .execute(&mut *stuck_tx)
        .await
        .unwrap();
    // The takeover gives up after the claim timeout (2 s by default), long before this.
    let (status, retry_after, body) = tokio::time::timeout(Duration::from_secs(8), retry)
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!((status, retry_after), (503, true), "{body}");
    assert_eq!(body["code"], "service_unavailable", "{body}");
    stuck_tx.rollback().await.unwrap();
    let (attempts, leased): (i32, bool) =
        sqlx::query_as("SELECT attempts, owner_token IS NOT NULL FROM idempotency_keys")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (attempts, leased),
        (attempts_before, false),
        "the timed-out takeover stored nothing"
    );

    let (status, _) = sys
        .post_until_final(&api.url, &account, "/v1/payments", "k", &payment_body(), 20)
        .await
        .unwrap();
    assert_eq!(status, 201);
}

/// A takeover whose commit's answer is lost (the failpoint `lose`: the database committed it, the
/// process is told its connection failed) gives the key back at once, as a first phase's lost
/// answer does: the retry after it is not met with `409` for a whole lease.
#[sqlx::test(migrations = "../migrations")]
async fn a_takeover_whose_answer_is_lost_gives_the_key_back(pool: PgPool) {
    let sys = System::start(pool.clone()).await;
    let api = sys.api("idem.claim.take_over.answer=lose").await;
    let account = sys.account("shop").await;
    sys.faults(json!({"error_rate": 1.0})).await;
    let body = payment_body();
    let post = || {
        let timeout = Duration::from_secs(10);
        sys.post(&api.url, &account, "/v1/payments", "k", &body, timeout)
    };
    let (status, _) = post().await.unwrap();
    assert_eq!(status, 503, "the processor failed, the key was released");
    sys.faults(json!({})).await;

    // The retry takes the free key over; the takeover commits and its answer is lost.
    let (status, _) = post().await.unwrap();
    assert!(api.wait_for("FAILPOINT idem.claim.take_over.answer", Duration::from_secs(5)).await);
    assert!((500..600).contains(&status), "{status}");
    let (attempts, leased): (i32, bool) =
        sqlx::query_as("SELECT attempts, owner_token IS NOT NULL FROM idempotency_keys")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((attempts, leased), (2, false), "taken over, and given back");
    let (status, _) = post().await.unwrap();
    assert_ne!(status, 409, "the next retry is not told the key is in use");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_deploy_during_slow_processor_calls_leaves_no_key_answering_409(pool: PgPool) {
    let sim =
        start_sim(processor_sim::FaultConfig { latency_ms: 3000, ..Default::default() }).await;
    let overrides = [
        ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
        ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "5000"),
        ("PAYMENTS__HTTP__SHUTDOWN_GRACE_MS", "200"),
    ];
    let app = Application::build_with_pool(test_settings(&overrides), pool.clone()).await.unwrap();
    let address = format!("http://127.0.0.1:{}", app.port());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async move {
        let _ = stopped.await;
    }));
    let (_, secret) = payments_domain::accounts::create_account(&pool, "shop")
        .await
        .map(|(account, _, secret)| (account, secret.expose().to_owned()))
        .unwrap();
    let keys: Vec<String> = (0..3 * scale()).map(|n| format!("deploy-{n}")).collect();
    let http = reqwest::Client::new();
    for key in &keys {
        let request = http
            .post(format!("{address}/v1/payments"))
            .bearer_auth(&secret)
            .header("idempotency-key", key)
            .json(&payment_body());
        // The answers never come: the server stops first.
        tokio::spawn(request.send());
    }
    // Every request is inside its processor call.
    let stats = format!("{sim}/_sim/stats");
    let mut calls = 0;
    for _ in 0..200 {
        let body: Value = http.get(&stats).send().await.unwrap().json().await.unwrap();
        calls = body["requests"].as_u64().unwrap_or(0);
        if calls == keys.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(calls, keys.len() as u64);

    // SIGTERM: the grace ends long before the calls do.
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE locked_until IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(leased, 0, "every lease was given back at the end of the grace");

    // The next process resumes every key at once.
    let next = TestApp::spawn_with(pool.clone(), pool.clone(), &overrides).await;
    let (next, secret) = (&next, &secret);
    let retries = keys.iter().map(|key| async move {
        let response = next.post("/v1/payments", secret, Some(key), &payment_body()).await;
        assert_eq!(response.status(), 201, "{key} resumed at once");
    });
    futures::future::join_all(retries).await;
    let charges: Value = http.get(&stats).send().await.unwrap().json().await.unwrap();
    assert_eq!(charges["charges_created"], keys.len() as u64, "one charge per key");
}

/// The database ends every session (a restart, a failover, `pg_terminate_backend`) while a
/// payment's call is out. Its last phase takes one of the pool's connections, ended, and answers
/// `500`; giving the key back on the pool's next connection, ended too, would fail as well. The
/// key is given back on a connection of its own, so a retry a second later resumes it instead of
/// meeting `409` until the lease runs out.
#[sqlx::test(migrations = "../migrations")]
async fn sessions_ended_during_a_phase_leave_the_key_free_for_a_retry_a_second_later(pool: PgPool) {
    let sim = start_sim(processor_sim::FaultConfig { latency_ms: 800, ..Default::default() }).await;
    let settings = [
        ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
        ("PAYMENTS__PROCESSOR__MAX_RETRIES", "0"),
        // Phases on the pool: the reference road.
        ("PAYMENTS__IDEMPOTENCY__FAST_PATH", "false"),
    ];
    // The pool the binaries make (a connection idle under a second is not checked when taken),
    // not the test's.
    let url = database_url(&pool);
    let serving = test_settings(&[("PAYMENTS__DATABASE__URL", url.as_str())]).database.pool();
    let serving = serving.unwrap();
    let app = TestApp::spawn_with(pool.clone(), serving.clone(), &settings).await;
    let (_, key) = app.create_account("shop").await;
    let send = || {
        let request = app.http.post(app.url("/v1/payments")).bearer_auth(&key);
        request.header("idempotency-key", "k").json(&payment_body()).send()
    };
    let first = tokio::spawn(send());

    let created = || async {
        let payments: i64 =
            sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(&pool).await.unwrap();
        payments == 1
    };
    payments_testkit::eventually("the first phase", Duration::from_secs(5), created).await;
    // The pool's connections were in use a moment before their sessions end, so none is checked
    // again when the last phase and the give-back take them (`IDLE_RECHECK`).
    let busy = (0..6).map(|_| sqlx::query("SELECT pg_sleep(0.05)").execute(&serving));
    futures::future::join_all(busy).await;
    let mut admin = sqlx::PgConnection::connect_with(&pool.connect_options()).await.unwrap();
    let ended = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()";
    let ended: i64 = sqlx::query_scalar(ended).fetch_one(&mut admin).await.unwrap();
    assert!(ended >= 6, "{ended} sessions ended");

    let first = first.await.unwrap().unwrap();
    assert!(first.status().is_server_error(), "{}", first.status());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let retry = send().await.unwrap();
    assert_eq!(retry.status(), 201, "the retry resumed the key");
}
