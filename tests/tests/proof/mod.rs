//! The fault matrix: the real binaries as separate processes against a real Postgres, faults
//! injected, and the invariants of the proof checked after every scenario.
//!
//! Counts are small so that `make test` stays fast; `PROOF_SCALE` and `PROOF_SEED` make longer,
//! different runs (`make proof`).

use std::sync::Arc;
use std::time::Duration;

use payments_tests::system::{Account, System, scale, seed};
use serde_json::{Value, json};
use sqlx::PgPool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovery {
    /// The client retries with the same key (after the dead holder's lease expired).
    ClientRetry,
    /// The completer finishes it; the client's retry then gets the stored answer.
    Completer,
}

fn payment_body(capture_method: &str) -> Value {
    json!({"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa",
           "capture_method": capture_method, "receipt_email": "buyer@example.com"})
}

/// A payment made through a healthy API; returns its id.
async fn payment(
    sys: &System,
    api: &str,
    account: &Account,
    key: &str,
    capture_method: &str,
) -> String {
    let (status, body) = sys
        .post_until_final(api, account, "/v1/payments", key, &payment_body(capture_method), 20)
        .await
        .unwrap();
    assert_eq!(status, 201);
    serde_json::from_slice::<Value>(&body).unwrap()["id"].as_str().unwrap().to_owned()
}

/// Sends a request to an API that stops at `failpoint`, kills it there with SIGKILL, and then
/// recovers the key the chosen way; returns the final answer's status.
/// One request as a client sends it.
struct Request<'a> {
    path: &'a str,
    key: &'a str,
    body: &'a Value,
}

async fn crash_and_recover(
    sys: &System,
    healthy_api: &str,
    account: &Account,
    request: &Request<'_>,
    failpoint: &str,
    recovery: Recovery,
) -> u16 {
    let Request { path, key, body } = *request;
    let mut doomed = sys.api(&format!("{failpoint}=pause")).await;
    let pending = {
        let (url, account, path, key, body) =
            (doomed.url.clone(), account.clone(), path.to_owned(), key.to_owned(), body.clone());
        let http = sys.http.clone();
        tokio::spawn(async move {
            http.post(format!("{url}{path}"))
                .bearer_auth(&account.secret)
                .header("idempotency-key", key)
                .json(&body)
                .timeout(Duration::from_secs(20))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    assert!(
        doomed.wait_for(&format!("FAILPOINT {failpoint}"), Duration::from_secs(20)).await,
        "{failpoint} was never reached"
    );
    doomed.kill9().await;
    assert!(pending.await.unwrap().is_err(), "the client of a killed process gets no answer");

    // Time passes: the dead holder's lease runs out.
    sys.expire_leases().await;
    if recovery == Recovery::Completer {
        assert!(sys.worker_once().await.success());
        let finished: bool = sqlx::query_scalar(
            "SELECT completed_at IS NOT NULL FROM idempotency_keys WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_one(&sys.pool)
        .await
        .unwrap();
        assert!(finished, "the completer finished {key} after a crash at {failpoint}");
    }
    let (status, _) =
        sys.post_until_final(healthy_api, account, path, key, body, 30).await.unwrap();
    status
}

async fn crash_matrix(pool: PgPool, operation: &str, recovery: Recovery) {
    let sys = System::start(pool).await;
    let api = sys.api("").await;
    let account = sys.account("crash").await;
    let (first_point, points) = match operation {
        "payments.create" => ("payment_created", 201),
        "payments.capture" => ("capture_started", 200),
        "payments.cancel" => ("cancel_started", 200),
        "refunds.create" => ("refund_created", 201),
        other => panic!("{other}"),
    };
    let failpoints = [
        format!("{operation}.after_phase.{first_point}"),
        format!("{operation}.before_call"),
        format!("{operation}.after_call"),
        format!("{operation}.after_phase.finished"),
    ];
    for (n, failpoint) in failpoints.iter().enumerate() {
        let key = format!("{operation}-{n}");
        let (path, body) = match operation {
            "payments.create" => ("/v1/payments".to_owned(), payment_body("automatic")),
            "payments.capture" => {
                let id = payment(&sys, &api.url, &account, &format!("setup-{n}"), "manual").await;
                (format!("/v1/payments/{id}/capture"), json!({"amount_to_capture": 700}))
            }
            "payments.cancel" => {
                let id = payment(&sys, &api.url, &account, &format!("setup-{n}"), "manual").await;
                (format!("/v1/payments/{id}/cancel"), json!({}))
            }
            _ => {
                let id =
                    payment(&sys, &api.url, &account, &format!("setup-{n}"), "automatic").await;
                (format!("/v1/payments/{id}/refunds"), json!({"amount": 400}))
            }
        };
        let status = crash_and_recover(
            &sys,
            &api.url,
            &account,
            &Request { path: &path, key: &key, body: &body },
            failpoint,
            recovery,
        )
        .await;
        assert_eq!(status, points, "{failpoint}");
    }
    // The job runner sends the receipts; then everything must hold.
    sys.make_due().await;
    assert!(sys.worker_once().await.success());
    let report = sys.check_invariants(true).await;
    assert!(report.payments >= failpoints.len());
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_create_killed_at_every_failpoint_is_finished_by_the_client_retry(pool: PgPool) {
    crash_matrix(pool, "payments.create", Recovery::ClientRetry).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_create_killed_at_every_failpoint_is_finished_by_the_completer(pool: PgPool) {
    crash_matrix(pool, "payments.create", Recovery::Completer).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_capture_killed_at_every_failpoint_is_finished_by_the_client_retry(pool: PgPool) {
    crash_matrix(pool, "payments.capture", Recovery::ClientRetry).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_capture_killed_at_every_failpoint_is_finished_by_the_completer(pool: PgPool) {
    crash_matrix(pool, "payments.capture", Recovery::Completer).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_cancel_killed_at_every_failpoint_is_finished_by_the_client_retry(pool: PgPool) {
    crash_matrix(pool, "payments.cancel", Recovery::ClientRetry).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_cancel_killed_at_every_failpoint_is_finished_by_the_completer(pool: PgPool) {
    crash_matrix(pool, "payments.cancel", Recovery::Completer).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_refund_killed_at_every_failpoint_is_finished_by_the_client_retry(pool: PgPool) {
    crash_matrix(pool, "refunds.create", Recovery::ClientRetry).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_refund_killed_at_every_failpoint_is_finished_by_the_completer(pool: PgPool) {
    crash_matrix(pool, "refunds.create", Recovery::Completer).await;
}

/// Clients that retry with the same key until they have a final answer.
async fn load(
    sys: &Arc<System>,
    apis: &[String],
    accounts: &[Account],
    clients: usize,
    per_client: usize,
    timeout: Duration,
) {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (sys, apis, account) =
            (sys.clone(), apis.to_vec(), accounts[c % accounts.len()].clone());
        tasks.push(tokio::spawn(async move {
            for n in 0..per_client {
                let key = format!("client{c}-payment{n}");
                let body = json!({"amount": 100 + n, "currency": "usd", "payment_method": "pm_card_visa",
                                  "receipt_email": "buyer@example.com"});
                for attempt in 0..40 {
                    let api = &apis[(c + attempt) % apis.len()];
                    if let Some((status, _)) = sys.post(api, &account, "/v1/payments", &key, &body, timeout).await
                        && payments_tests::system::is_final(status)
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

async fn finish_and_check(sys: &System) -> payments_tests::invariants::InvariantReport {
    sys.faults(json!({})).await;
    sys.expire_leases().await;
    sys.make_due().await;
    assert!(sys.worker_once().await.success());
    sys.check_invariants(true).await
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn lost_processor_responses_never_charge_twice(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    sys.faults(json!({"seed": seed(), "lost_response_rate": 0.3})).await;
    let api = sys.api("").await;
    let accounts = [sys.account("a").await, sys.account("b").await];
    load(&sys, std::slice::from_ref(&api.url), &accounts, 4, 5 * scale(), Duration::from_secs(10))
        .await;
    assert!(sys.sim_stats().await["faults_injected"].as_u64().unwrap() > 0, "faults were injected");
    let report = finish_and_check(&sys).await;
    assert_eq!(report.payments, 20 * scale());
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn processor_errors_rate_limits_timeouts_and_slow_answers_never_charge_twice(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    sys.faults(
        json!({"seed": seed(), "error_rate": 0.15, "rate_limit_rate": 0.1, "drop_rate": 0.1,
                      "latency_ms": 5, "jitter_ms": 20}),
    )
    .await;
    let api = sys.api("").await;
    let accounts = [sys.account("a").await];
    load(&sys, std::slice::from_ref(&api.url), &accounts, 4, 5 * scale(), Duration::from_secs(10))
        .await;
    assert!(sys.sim_stats().await["faults_injected"].as_u64().unwrap() > 0);
    finish_and_check(&sys).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_slow_holder_that_lost_its_lease_is_fenced_off(pool: PgPool) {
    let sys = System::start(pool).await;
    let account = sys.account("race").await;
    // The first holder stalls for 4 s right after the charge, before recording it.
    let slow = sys.api("payments.create.after_call=sleep(4000)").await;
    let body = payment_body("automatic");
    let first = {
        let (url, account, body, http) =
            (slow.url.clone(), account.clone(), body.clone(), sys.http.clone());
        tokio::spawn(async move {
            let response = http
                .post(format!("{url}/v1/payments"))
                .bearer_auth(&account.secret)
                .header("idempotency-key", "race")
                .json(&body)
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.bytes().await.unwrap().to_vec())
        })
    };
    assert!(slow.wait_for("FAILPOINT payments.create.after_call", Duration::from_secs(10)).await);
    // Its lease runs out while it stalls; a retry on another process takes the key over.
    sys.expire_leases().await;
    let fast = sys.api("").await;
    let (status, winner) =
        sys.post_until_final(&fast.url, &account, "/v1/payments", "race", &body, 10).await.unwrap();
    assert_eq!(status, 201);

    let (late_status, _) = first.await.unwrap();
    assert_eq!(late_status, 409, "the late holder's commit was refused by the fence");
    let stored: Vec<u8> = sqlx::query_scalar("SELECT response_body FROM idempotency_keys")
        .fetch_one(&sys.pool)
        .await
        .unwrap();
    assert_eq!(stored, winner, "the stored answer is the new holder's");
    let audit: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'payment.charged'")
            .fetch_one(&sys.pool)
            .await
            .unwrap();
    assert_eq!(audit, 1, "the late phase left nothing behind");
    assert_eq!(sys.sim_stats().await["charges_created"], 1);
    sys.check_invariants(false).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn duplicate_storms_across_two_api_processes_make_one_payment_per_key(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    let (a, b) = (sys.api("").await, sys.api("").await);
    let account = sys.account("storm").await;
    let keys = 5 * scale();
    let mut tasks = Vec::new();
    for k in 0..keys {
        for r in 0..10 {
            let (sys, url, account) = (
                sys.clone(),
                if r % 2 == 0 { a.url.clone() } else { b.url.clone() },
                account.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let body =
                    json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
                sys.post_until_final(
                    &url,
                    &account,
                    "/v1/payments",
                    &format!("storm-{k}"),
                    &body,
                    50,
                )
                .await
            }));
        }
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().map(|(s, _)| s), Some(201));
    }
    let report = sys.check_invariants(false).await;
    assert_eq!(report.payments, keys);
    assert_eq!(sys.sim_stats().await["charges_created"], keys as u64);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn two_workers_at_once_finish_every_abandoned_key_once(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    let account = sys.account("abandoned").await;
    // An API that stops every payment right before the processor call, then dies.
    let mut doomed = sys.api("payments.create.before_call=pause").await;
    let count = 10 * scale();
    for n in 0..count {
        let (sys, url, account) = (sys.clone(), doomed.url.clone(), account.clone());
        tokio::spawn(async move {
            sys.post(
                &url,
                &account,
                "/v1/payments",
                &format!("k{n}"),
                &payment_body("automatic"),
                Duration::from_secs(30),
            )
            .await
        });
    }
    for _ in 0..200 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'payment_created'",
        )
        .fetch_one(&sys.pool)
        .await
        .unwrap();
        if waiting == count as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    doomed.kill9().await;
    sys.expire_leases().await;
    let (one, two) = tokio::join!(sys.worker_once(), sys.worker_once());
    assert!(one.success() && two.success());
    let report = sys.check_invariants(true).await;
    assert_eq!(report.payments, count);
    assert_eq!(sys.sim_stats().await["charges_created"], count as u64);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn clients_that_hang_up_still_get_their_payment(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    sys.faults(json!({"latency_ms": 400})).await;
    let api = sys.api("").await;
    let account = sys.account("impatient").await;
    let count = 5 * scale();
    for n in 0..count {
        let gone = sys
            .post(
                &api.url,
                &account,
                "/v1/payments",
                &format!("k{n}"),
                &payment_body("automatic"),
                Duration::from_millis(100),
            )
            .await;
        assert!(gone.is_none(), "the client hung up before the answer");
    }
    // The work goes on without the clients; their retries find it done.
    for _ in 0..200 {
        let finished: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM idempotency_keys WHERE completed_at IS NOT NULL",
        )
        .fetch_one(&sys.pool)
        .await
        .unwrap();
        if finished == count as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sys.faults(json!({})).await;
    for n in 0..count {
        let response = sys
            .http
            .post(format!("{}/v1/payments", api.url))
            .bearer_auth(&account.secret)
            .header("idempotency-key", format!("k{n}"))
            .json(&payment_body("automatic"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(
            response.headers()["idempotent-replayed"],
            "true",
            "finished while nobody was listening"
        );
    }
    assert_eq!(sys.sim_stats().await["charges_created"], count as u64);
    finish_and_check(&sys).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_database_outage_under_load_is_survived_and_loses_nothing(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    let api = sys.api("").await;
    let accounts = [sys.account("a").await];
    let database = sys.db_url.rsplit('/').next().unwrap().to_owned();
    let admin = sqlx::PgPool::connect(&sys.db_url.replace(&format!("/{database}"), "/postgres"))
        .await
        .unwrap();
    // Warm up: the API holds pooled connections when the database goes away.
    load(&sys, std::slice::from_ref(&api.url), &accounts, 2, 2, Duration::from_secs(10)).await;

    // The database goes away: no new connections, and every open one is cut. The clients keep
    // sending while it is away, and for as long as they need after it is back.
    sqlx::query(&format!("ALTER DATABASE \"{database}\" ALLOW_CONNECTIONS false"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
        .bind(&database)
        .execute(&admin)
        .await
        .unwrap();
    let clients = {
        let (sys, url, accounts) = (sys.clone(), api.url.clone(), accounts.clone());
        tokio::spawn(async move {
            load(&sys, &[url], &accounts, 4, 5 * scale(), Duration::from_secs(10)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query(&format!("ALTER DATABASE \"{database}\" ALLOW_CONNECTIONS true"))
        .execute(&admin)
        .await
        .unwrap();
    clients.await.unwrap();
    let statuses: Vec<u16> = sys.ledger_statuses();
    // While the database is away the API answers 500 (or 503); a key whose holder could not even
    // release it stays leased, and answers 409 until the lease runs out. A client that retries
    // fast while its API key cannot be looked up meets the per-address limit for unverified keys
    // (429, with Retry-After). Never anything else: every one of these says "retry".
    assert!(statuses.contains(&500), "the outage was felt: {statuses:?}");
    assert!(statuses.iter().all(|s| [201, 409, 429, 500, 503].contains(s)), "{statuses:?}");
    let ready = sys.http.get(format!("{}/readyz", api.url)).send().await.unwrap();
    assert_eq!(ready.status(), 200, "the API recovered by itself");
    finish_and_check(&sys).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_invariant_checker_catches_a_second_charge(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    let api = sys.api("").await;
    let account = sys.account("victim").await;
    let id = payment(&sys, &api.url, &account, "k", "automatic").await;
    sys.check_invariants(false).await;

    // A second charge for the same payment, made behind the system's back.
    sys.http
        .post(format!("{}/v1/charges", sys.sim.url))
        .bearer_auth("sk_test_intruder")
        .header("idempotency-key", "double")
        .form(&[
            ("amount", "1000"),
            ("currency", "usd"),
            ("source", "pm_card_visa"),
            ("metadata[payment_id]", id.as_str()),
        ])
        .send()
        .await
        .unwrap();
    let checked = tokio::spawn({
        let sys = sys.clone();
        async move { sys.check_invariants(false).await }
    });
    let panic = checked.await.unwrap_err().into_panic();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("has 2 successful charges"), "a double charge is caught: {message}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn processor_timeouts_are_unknown_outcomes_that_resume_without_a_second_charge(pool: PgPool) {
    let sys = Arc::new(System::start(pool).await);
    // Slower than the API's 1 s processor timeout: the charge happens (the stand-in finishes what
    // it received), but the API stops waiting for the answer.
    sys.faults(json!({"latency_ms": 1300})).await;
    let api = sys.api("").await;
    let account = sys.account("patient").await;
    let mut timed_out = Vec::new();
    for n in 0..3 {
        let (sys, url, account) = (sys.clone(), api.url.clone(), account.clone());
        timed_out.push(tokio::spawn(async move {
            sys.post(
                &url,
                &account,
                "/v1/payments",
                &format!("t{n}"),
                &payment_body("automatic"),
                Duration::from_secs(20),
            )
            .await
        }));
    }
    for request in timed_out {
        let (status, _) = request.await.unwrap().unwrap();
        assert_eq!(status, 503, "a timeout is not an answer");
    }
    // The processor did charge; the retries, under the same downstream keys, find those charges.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sys.faults(json!({})).await;
    for n in 0..3 {
        let (status, _) = sys
            .post_until_final(
                &api.url,
                &account,
                "/v1/payments",
                &format!("t{n}"),
                &payment_body("automatic"),
                10,
            )
            .await
            .unwrap();
        assert_eq!(status, 201);
    }
    let stats = sys.sim_stats().await;
    assert_eq!(stats["charges_created"], 3, "{stats}");
    assert!(stats["idempotent_replays"].as_u64().unwrap() >= 3, "{stats}");
    finish_and_check(&sys).await;
}

// ---------------------------------------------------------------------------------------------
// When the processor cannot tell us: frozen requests, reconciliation, the processor's window.
// The stand-in runs in its strict mode (as Stripe does: every executed request's answer, a 500
// included, is kept for its key; the same key with other parameters is an idempotency_error).

/// The operation's request (path, body) on a fresh payment made through `api`; `n` keeps the
/// set-up keys apart.
async fn operation_request(
    sys: &System,
    api: &str,
    account: &Account,
    operation: &str,
    n: usize,
) -> (String, Value) {
    match operation {
        "payments.create" => ("/v1/payments".to_owned(), payment_body("automatic")),
        "payments.capture" => {
            let id = payment(sys, api, account, &format!("setup-{operation}-{n}"), "manual").await;
            (format!("/v1/payments/{id}/capture"), json!({"amount_to_capture": 700}))
        }
        "payments.cancel" => {
            let id = payment(sys, api, account, &format!("setup-{operation}-{n}"), "manual").await;
            (format!("/v1/payments/{id}/cancel"), json!({}))
        }
        "refunds.create" => {
            let id =
                payment(sys, api, account, &format!("setup-{operation}-{n}"), "automatic").await;
            (format!("/v1/payments/{id}/refunds"), json!({"amount": 400}))
        }
        other => panic!("{other}"),
    }
}

fn success_status(operation: &str) -> u16 {
    if matches!(operation, "payments.create" | "refunds.create") { 201 } else { 200 }
}

const MONEY_MOVING: [&str; 4] =
    ["payments.create", "payments.capture", "payments.cancel", "refunds.create"];

/// The audit actions recorded for objects of the account, in order.
async fn audit_actions(sys: &System, action_like: &str) -> Vec<(String, Value)> {
    sqlx::query_as("SELECT action, detail FROM audit_events WHERE action LIKE $1 ORDER BY id")
        .bind(action_like)
        .fetch_all(&sys.pool)
        .await
        .expect("the audit records")
}

async fn patch_payment(sys: &System, api: &str, account: &Account, id: &str, body: Value) -> u16 {
    sys.http
        .patch(format!("{api}/v1/payments/{id}"))
        .bearer_auth(&account.secret)
        .header("content-type", "application/merge-patch+json")
        .json(&body)
        .send()
        .await
        .expect("the PATCH is answered")
        .status()
        .as_u16()
}

async fn newest_payment(sys: &System) -> String {
    sqlx::query_scalar("SELECT id FROM payments ORDER BY created_at DESC, id LIMIT 1")
        .fetch_one(&sys.pool)
        .await
        .expect("a payment")
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_patch_between_a_lost_answer_and_the_retry_changes_no_request_in_flight(pool: PgPool) {
    let sys = System::start(pool).await;
    let api = sys.api("").await;
    let account = sys.account("patch").await;
    for (n, operation) in
        ["payments.create", "payments.capture", "refunds.create"].iter().enumerate()
    {
        let (path, mut body) = operation_request(&sys, &api.url, &account, operation, n).await;
        if *operation == "payments.create" {
            body["description"] = json!("before");
        }
        let key = format!("patched-{operation}");
        // Every answer is lost: the processor acts, and the API cannot know.
        sys.faults(json!({"lost_response_rate": 1.0})).await;
        let lost = sys.post(&api.url, &account, &path, &key, &body, Duration::from_secs(10)).await;
        assert_eq!(lost.map(|(status, _)| status), Some(503), "{operation}");
        let id = newest_payment(&sys).await;
        let patched = json!({"description": format!("changed while {operation} was in flight")});
        assert_eq!(patch_payment(&sys, &api.url, &account, &id, patched).await, 200);
        sys.faults(json!({})).await;
        let (status, _) =
            sys.post_until_final(&api.url, &account, &path, &key, &body, 10).await.unwrap();
        assert_eq!(status, success_status(operation), "{operation}");
    }
    // The retries sent what the first attempts sent: the processor never saw a changed request.
    assert_eq!(sys.sim_stats().await["idempotency_errors"], 0);
    assert!(audit_actions(&sys, "%.reconciled").await.is_empty());
    sys.check_invariants(false).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_release_that_changes_the_charge_form_sends_the_frozen_charge(pool: PgPool) {
    let sys = System::start(pool).await;
    let account = sys.account("release").await;
    let body = payment_body("automatic");
    let mut old_release = sys.api("").await;
    sys.faults(json!({"lost_response_rate": 1.0})).await;
    let lost = sys
        .post(&old_release.url, &account, "/v1/payments", "deploy", &body, Duration::from_secs(10))
        .await;
    assert_eq!(lost.map(|(status, _)| status), Some(503));
    old_release.kill9().await;
    // The next release tags every new charge.
    let new_release =
        sys.api_with("", &[("PAYMENTS__PROCESSOR__CHARGE_METADATA__RELEASE", "two")]).await;
    sys.faults(json!({})).await;
    let (status, _) = sys
        .post_until_final(&new_release.url, &account, "/v1/payments", "deploy", &body, 10)
        .await
        .unwrap();
    assert_eq!(status, 201);
    let (status, _) = sys
        .post_until_final(&new_release.url, &account, "/v1/payments", "after-deploy", &body, 10)
        .await
        .unwrap();
    assert_eq!(status, 201);
    let tags: Vec<Option<String>> = sys
        .charges()
        .await
        .iter()
        .rev()
        .map(|charge| charge["metadata"]["release"].as_str().map(str::to_owned))
        .collect();
    // The charge in flight kept its first form; the new one has the new form.
    assert_eq!(tags, vec![None, Some("two".to_owned())]);
    assert_eq!(sys.sim_stats().await["idempotency_errors"], 0);
    sys.check_invariants(false).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_500_after_processing_is_reconciled_on_the_request_itself(pool: PgPool) {
    let sys = System::start(pool).await;
    let api = sys.api("").await;
    let account = sys.account("stored-500").await;
    for (n, operation) in MONEY_MOVING.iter().enumerate() {
        let (path, body) = operation_request(&sys, &api.url, &account, operation, n).await;
        // The processor acts, answers 500 and keeps that 500 for the key: the client's retry
        // with the same key can only get it again, so the API looks the object up.
        sys.faults(json!({"error_after_processing_rate": 1.0})).await;
        let (status, _) = sys
            .post_until_final(&api.url, &account, &path, &format!("stored-500-{n}"), &body, 5)
            .await
            .unwrap();
        sys.faults(json!({})).await;
        assert_eq!(status, success_status(operation), "{operation}");
    }
    let adopted = audit_actions(&sys, "%.reconciled").await;
    assert_eq!(adopted.len(), MONEY_MOVING.len(), "{adopted:?}");
    assert!(adopted.iter().all(|(_, detail)| detail["outcome"] == "adopted"), "{adopted:?}");
    let report = finish_and_check(&sys).await;
    assert_eq!(report.payments, 4);
}

async fn five_hundred_after_processing_matrix(pool: PgPool, recovery: Recovery) {
    let sys = System::start(pool).await;
    let api = sys.api("").await;
    let account = sys.account("stored-500").await;
    for (n, operation) in MONEY_MOVING.iter().enumerate() {
        let (path, body) = operation_request(&sys, &api.url, &account, operation, n).await;
        sys.faults(json!({"error_after_processing_rate": 1.0})).await;
        // The API dies right after the call; a retry or the completer meets the kept 500.
        let key = format!("stored-500-{n}");
        let request = Request { path: &path, key: &key, body: &body };
        let failpoint = format!("{operation}.after_call");
        let status =
            crash_and_recover(&sys, &api.url, &account, &request, &failpoint, recovery).await;
        sys.faults(json!({})).await;
        assert_eq!(status, success_status(operation), "{operation}");
    }
    assert_eq!(audit_actions(&sys, "%.reconciled").await.len(), MONEY_MOVING.len());
    finish_and_check(&sys).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_500_after_processing_at_every_call_is_reconciled_by_the_client_retry(pool: PgPool) {
    five_hundred_after_processing_matrix(pool, Recovery::ClientRetry).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_500_after_processing_at_every_call_is_reconciled_by_the_completer(pool: PgPool) {
    five_hundred_after_processing_matrix(pool, Recovery::Completer).await;
}

/// A create that ends with an unknown outcome, its key then made `hours` old.
async fn unknown_outcome_aged(sys: &System, api: &str, account: &Account, key: &str, hours: i32) {
    sys.faults(json!({"lost_response_rate": 1.0})).await;
    let lost = sys
        .post(
            api,
            account,
            "/v1/payments",
            key,
            &payment_body("automatic"),
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(lost.map(|(status, _)| status), Some(503));
    sys.faults(json!({})).await;
    sqlx::query("UPDATE idempotency_keys SET created_at = now() - make_interval(hours => $2) WHERE idempotency_key = $1")
        .bind(key)
        .bind(hours)
        .execute(&sys.pool)
        .await
        .expect("the key ages");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_retry_past_the_processors_window_calls_nobody_and_is_referred_to_a_person(pool: PgPool) {
    let sys = System::start(pool).await;
    let api = sys.api("").await;
    let account = sys.account("late").await;
    unknown_outcome_aged(&sys, &api.url, &account, "late", 25).await;
    let requests = sys.sim_stats().await["requests"].clone();
    // The worker is stopped; the client comes back a day later.
    let answer = sys
        .http
        .post(format!("{}/v1/payments", api.url))
        .bearer_auth(&account.secret)
        .header("idempotency-key", "late")
        .json(&payment_body("automatic"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 422);
    assert!(answer.headers().get("retry-after").is_none(), "no retry can help");
    let problem: Value = answer.json().await.unwrap();
    assert_eq!(problem["code"], "operation_needs_review");
    // Every later retry gets the same answer, and nobody called the processor.
    let again = sys
        .post(
            &api.url,
            &account,
            "/v1/payments",
            "late",
            &payment_body("automatic"),
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(again.map(|(status, _)| status), Some(422));
    assert_eq!(sys.sim_stats().await["requests"], requests);
    let flagged: bool = sqlx::query_scalar(
        "SELECT needs_human_at IS NOT NULL FROM idempotency_keys WHERE idempotency_key = 'late'",
    )
    .fetch_one(&sys.pool)
    .await
    .unwrap();
    assert!(flagged);
    sys.check_invariants(true).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_completer_never_drives_a_key_past_the_processors_window(pool: PgPool) {
    let sys = System::start(pool).await;
    let api = sys.api("").await;
    let account = sys.account("late").await;
    unknown_outcome_aged(&sys, &api.url, &account, "late", 25).await;
    let requests = sys.sim_stats().await["requests"].clone();
    sys.make_due().await;
    assert!(sys.worker_once().await.success());
    assert_eq!(sys.sim_stats().await["requests"], requests);
    let (status, body) = sys
        .post(
            &api.url,
            &account,
            "/v1/payments",
            "late",
            &payment_body("automatic"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(status, 422, "{}", String::from_utf8_lossy(&body));
    sys.check_invariants(true).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_search_inside_its_lag_is_never_taken_for_not_found(pool: PgPool) {
    let sys = System::start(pool).await;
    // The API knows the processor's search may trail by 2 s; the processor trails by 1.5 s.
    let api = sys.api_with("", &[("PAYMENTS__PROCESSOR__SEARCH_LAG_MS", "2000")]).await;
    let account = sys.account("lag").await;
    sys.faults(json!({"error_after_processing_rate": 1.0, "search_lag_ms": 1500})).await;
    let body = payment_body("automatic");
    let first = sys
        .http
        .post(format!("{}/v1/payments", api.url))
        .bearer_auth(&account.secret)
        .header("idempotency-key", "lag")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 503, "the charge is not visible yet");
    // Waiting for the lookup to settle is no failed attempt: the answer says when "nothing" could
    // be believed (the longest call, 6 s here, plus the 2 s lag), and the completer waits as long.
    let retry_after: u64 = first.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((8..=10).contains(&retry_after), "Retry-After: {retry_after}");
    let due_in: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM idempotency_keys",
    )
    .fetch_one(&sys.pool)
    .await
    .unwrap();
    assert!(due_in > 6.0, "the completer looks again only once it can believe nothing: {due_in}");
    // Retries inside the processor's lag find nothing, and nothing found proves nothing yet: no
    // second charge is started.
    for _ in 0..3 {
        let again = sys
            .post(&api.url, &account, "/v1/payments", "lag", &body, Duration::from_secs(10))
            .await;
        assert_eq!(again.map(|(status, _)| status), Some(503));
    }
    assert_eq!(sys.sim_stats().await["charges_created"], 1);
    // The lag passes: the charge shows, and it is adopted.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let (status, _) =
        sys.post_until_final(&api.url, &account, "/v1/payments", "lag", &body, 5).await.unwrap();
    assert_eq!(status, 201);
    assert_eq!(sys.sim_stats().await["charges_created"], 1);
    sys.faults(json!({})).await;
    sys.check_invariants(false).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_key_used_by_someone_else_moves_to_its_next_generation_once_nothing_is_found(
    pool: PgPool,
) {
    let (sys, id) = squatted_then_retried(pool, "pm_card_visa", 201).await;
    let charges = sys.charges().await;
    assert_eq!(charges.len(), 1);
    let generations = audit_actions(&sys, "payment.reconciled").await;
    assert_eq!(generations.len(), 1, "{generations:?}");
    assert_eq!(generations[0].1["outcome"], "next_generation");
    assert_eq!(generations[0].1["downstream_key"], format!("{id}/charge/2"));
    sys.check_invariants(false).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_refusal_of_a_later_key_generation_is_referred_to_a_person_not_stored(pool: PgPool) {
    // The next generation is declined. That proves nothing about the first one (a lookup may
    // have missed it), so no failure is stored behind a charge that might exist: a person looks.
    let (sys, id) = squatted_then_retried(pool, "pm_card_chargeDeclined", 422).await;
    let (status, flagged): (String, bool) = sqlx::query_as(
        "SELECT p.status, k.needs_human_at IS NOT NULL FROM payments p \
         JOIN idempotency_keys k ON k.id = p.idempotency_key_id WHERE p.id = $1",
    )
    .bind(&id)
    .fetch_one(&sys.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), flagged), ("processing", true));
    sys.check_invariants(true).await;
}

/// A payment with `card` whose downstream key someone else used first, then retried once a
/// lookup that finds nothing can be trusted; the retry's final status is `expected`.
async fn squatted_then_retried(pool: PgPool, card: &str, expected: u16) -> (System, String) {
    let sys = System::start(pool).await;
    let account = sys.account("squatted").await;
    let mut body = payment_body("automatic");
    body["payment_method"] = json!(card);
    // The first attempt stops right before its call, and dies there.
    let mut doomed = sys.api("payments.create.before_call=pause").await;
    let pending = {
        let (sys_http, url, secret, body) =
            (sys.http.clone(), doomed.url.clone(), account.secret.clone(), body.clone());
        tokio::spawn(async move {
            sys_http
                .post(format!("{url}/v1/payments"))
                .bearer_auth(secret)
                .header("idempotency-key", "squatted")
                .json(&body)
                .timeout(Duration::from_secs(20))
                .send()
                .await
        })
    };
    assert!(
        doomed.wait_for("FAILPOINT payments.create.before_call", Duration::from_secs(20)).await
    );
    doomed.kill9().await;
    let _ = pending.await;
    // Someone else (another deployment with our processor key) uses the payment's downstream key
    // first, with other parameters; the processor refuses it (an unknown card) and keeps that
    // answer for the key. No charge was made.
    let id = newest_payment(&sys).await;
    let squat = sys
        .http
        .post(format!("{}/v1/charges", sys.sim.url))
        .bearer_auth("sk_test_processor")
        .header("idempotency-key", format!("{id}/charge"))
        .form(&[("amount", "1"), ("currency", "usd"), ("source", "pm_card_unknown")])
        .send()
        .await
        .unwrap();
    assert_eq!(squat.status(), 400);
    sys.expire_leases().await;
    let api = sys.api_with("", &[("PAYMENTS__PROCESSOR__SEARCH_LAG_MS", "0")]).await;
    // The processor refuses our frozen request under that key; nothing is found, but the call
    // is too recent for "nothing" to be trusted.
    let refused = sys
        .post(&api.url, &account, "/v1/payments", "squatted", &body, Duration::from_secs(10))
        .await;
    assert_eq!(refused.map(|(status, _)| status), Some(503));
    assert_eq!(sys.sim_stats().await["charges_created"], 0);
    // By the database's clock the call is now old enough: the next generation is charged.
    sqlx::query("UPDATE idempotency_keys SET unresolved_at = unresolved_at - interval '1 minute'")
        .execute(&sys.pool)
        .await
        .unwrap();
    let answer =
        sys.post_until_final(&api.url, &account, "/v1/payments", "squatted", &body, 5).await;
    assert_eq!(answer.map(|(status, _)| status), Some(expected), "{}", api.log());
    drop(api);
    (sys, id)
}

mod later;
