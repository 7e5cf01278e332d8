//! The worker against a real Postgres and the stand-in processor: the completer finishes what
//! others abandoned, the reaper removes only what it may, and jobs run at least once and effect once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use idem::{
    Claim, Engine, Fingerprint, IdempotencyKey, NoObserver, Operation, RecoveryPoint, Request,
    RequestParts,
};
use payments_domain::jobs::ReceiptJob;
use payments_domain::money::{Amount, Currency};
use payments_domain::operations::{
    self, CancelParams, CancelPayment, CaptureParams, CapturePayment, Context, CreatePayment,
    CreatePaymentParams, CreateRefundOp, RefundParams,
};
use payments_domain::payments::{CaptureMethod, NewPayment};
use payments_domain::refunds::NewRefund;
use payments_domain::webhooks::SealingKeys;
use payments_domain::{AccountId, PaymentId};
use payments_settings::Settings;
use payments_testkit::{WAIT, eventually};
use payments_worker::jobs::{Mailer, Receipt, ReceiptOutcome, ReceiptSender, SmtpMailer};
use payments_worker::{PassReport, Worker};
use processor_sim::{FaultConfig, Simulator};
use provider::{ProcessorClient, ProcessorConfig};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;

/// Counts receipts; fails while `failures` is above zero.
#[derive(Default)]
struct CountingMailer {
    sent: AtomicUsize,
    failing: std::sync::atomic::AtomicBool,
}

impl Mailer for CountingMailer {
    fn send<'a>(&'a self, _receipt: &'a Receipt) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if self.failing.load(Ordering::SeqCst) {
                return Err("smtp server unreachable".into());
            }
            self.sent.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

struct Harness {
    pool: PgPool,
    sim: String,
    ctx: Context<ProcessorClient>,
    engine: Engine,
    settings: Settings,
    mailer: Arc<CountingMailer>,
    account: AccountId,
}

async fn harness(pool: PgPool) -> Harness {
    harness_with(pool, &[]).await
}

/// A harness whose settings also have `overrides` (environment variable, value).
async fn harness_with(pool: PgPool, overrides: &[(&str, &str)]) -> Harness {
    let simulator = Simulator::build("127.0.0.1:0", FaultConfig::default()).await.unwrap();
    let sim = format!("http://127.0.0.1:{}", simulator.port());
    tokio::spawn(simulator.run_until(std::future::pending()));
    let mut env = vec![
        ("PAYMENTS__PROCESSOR__BASE_URL".to_owned(), sim.clone()),
        ("PAYMENTS__WORKER__JOB_MAX_ATTEMPTS".to_owned(), "3".to_owned()),
        ("PAYMENTS__WEBHOOKS__SEALING_KEY".to_owned(), "5e".repeat(32)),
    ];
    env.extend(overrides.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let settings = Settings::load_from(env).unwrap();
    let processor = ProcessorClient::new(ProcessorConfig {
        max_retries: 0,
        ..settings.processor.client_config()
    })
    .unwrap();
    let keys = Arc::new(SealingKeys::new([0x5e; 32], []));
    let ctx = Context::new(pool.clone(), Arc::new(processor), "http://test".into(), keys);
    let engine = Engine::new(pool.clone(), settings.engine_config(), Arc::new(NoObserver));
    let (account, _, _) = payments_domain::accounts::create_account(&pool, "shop").await.unwrap();
    // Every payment is in test mode: receipts go only to the account's verified addresses.
    payments_domain::accounts::verify_email(&pool, &account.id, "Jo@Example.com").await.unwrap();
    Harness { pool, sim, ctx, engine, settings, mailer: Arc::default(), account: account.id }
}

impl Harness {
    fn worker(&self) -> Worker<ProcessorClient> {
        Worker::new(
            self.pool.clone(),
            self.ctx.processor.clone(),
            "http://test".into(),
            &self.settings,
            self.mailer.clone(),
        )
        .unwrap()
    }

    async fn pass(&self) -> PassReport {
        let (_stop_tx, stop) = watch::channel(false);
        self.worker().run_once(&stop).await.unwrap()
    }

    async fn claim(&self, key: &str, operation: &str, params: &Value) -> Claim {
        let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
        let fingerprint = Fingerprint::of(&RequestParts {
            method: "POST",
            path: "/test",
            query: "",
            media_type: "application/json",
            version: None,
            if_match: None,
            body: params,
        });
        self.engine
            .claim(&Request {
                account_id: self.account.as_str().into(),
                credential: None,
                key,
                fingerprint,
                method: "POST".into(),
                path: "/test".into(),
                request_id: "req_test".into(),
                operation: operation.into(),
                params: params.clone().into(),
            })
            .await
            .unwrap()
    }

    /// Runs `op` under a new key up to `stop_at`, then walks away as a crashed process would.
    async fn abandon<O: Operation>(
        &self,
        key: &str,
        operation: &str,
        params: &Value,
        mut op: O,
        stop_at: O::Point,
    ) {
        let Claim::Acquired(mut lease) = self.claim(key, operation, params).await else {
            panic!("new key")
        };
        while lease.point::<O::Point>().unwrap() != stop_at {
            let at = lease.point::<O::Point>().unwrap();
            op.step(&mut lease, at).await.unwrap();
        }
        // A new key is stored by its first phase; one left at `started` is stored by the check
        // before a call (or was left by a claim that stored keys on its own, before issue #18).
        lease.renew().await.unwrap();
        drop(lease);
        sqlx::query("UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE idempotency_key = $1")
            .bind(key)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    fn create_params(
        &self,
        capture_method: CaptureMethod,
        email: Option<&str>,
    ) -> CreatePaymentParams {
        CreatePaymentParams {
            account_id: self.account.clone(),
            request: NewPayment {
                amount: Amount::new(1000).unwrap(),
                currency: Currency::new("usd").unwrap(),
                payment_method: "pm_card_visa".into(),
                capture_method,
                description: None,
                metadata: Default::default(),
                receipt_email: email.map(str::to_owned),
            },
        }
    }

    /// A payment made in one go; returns its id.
    async fn paid(&self, key: &str, capture_method: CaptureMethod) -> PaymentId {
        let params = self.create_params(capture_method, None);
        let Claim::Acquired(lease) = self
            .claim(key, operations::CREATE_PAYMENT, &serde_json::to_value(&params).unwrap())
            .await
        else {
            panic!("new key")
        };
        let answer =
            idem::drive(&mut CreatePayment::new(self.ctx.clone(), params), lease).await.unwrap();
        let body: Value = serde_json::from_slice(&answer.body).unwrap();
        PaymentId::parse(body["id"].as_str().unwrap()).unwrap()
    }

    /// A payment made in one go with a receipt to send to the account's verified address (its
    /// job staged); returns its answer.
    async fn paid_with_receipt(&self, key: &str) -> idem::StoredResponse {
        self.paid_with_receipt_to(key, "jo@example.com").await
    }

    /// A payment made in one go with a receipt to send to `email`; returns its answer.
    async fn paid_with_receipt_to(&self, key: &str, email: &str) -> idem::StoredResponse {
        let params = self.create_params(CaptureMethod::Automatic, Some(email));
        let value = serde_json::to_value(&params).unwrap();
        let Claim::Acquired(lease) = self.claim(key, operations::CREATE_PAYMENT, &value).await
        else {
            panic!("new key")
        };
        idem::drive(&mut CreatePayment::new(self.ctx.clone(), params), lease).await.unwrap()
    }

    /// A payment abandoned after its first phase, before its call: the completer must call.
    async fn abandoned_before_the_call(&self, key: &str) {
        let params = self.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        let op = CreatePayment::new(self.ctx.clone(), params);
        let point = operations::CreatePoint::PaymentCreated;
        self.abandon(key, operations::CREATE_PAYMENT, &value, op, point).await;
    }

    async fn stats(&self) -> Value {
        reqwest::get(format!("{}/_sim/stats", self.sim)).await.unwrap().json().await.unwrap()
    }

    async fn key_row(&self, key: &str) -> (String, Option<i16>, bool) {
        sqlx::query_as("SELECT recovery_point, response_status, needs_human_at IS NOT NULL FROM idempotency_keys WHERE idempotency_key = $1")
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The key finished with `status`, and a client retry now replays exactly that answer.
    async fn assert_finished_and_replayed(
        &self,
        key: &str,
        operation: &str,
        params: &Value,
        status: i16,
    ) {
        assert_eq!(self.key_row(key).await, ("finished".into(), Some(status), false), "{key}");
        let stored: Vec<u8> = sqlx::query_scalar(
            "SELECT response_body FROM idempotency_keys WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        match self.claim(key, operation, params).await {
            Claim::Replay(answer) => {
                assert_eq!((answer.status as i16, answer.body), (status, stored))
            }
            other => panic!("expected a replay for {key}, got {other:?}"),
        }
    }
}

fn points<P: RecoveryPoint>(names: &[&str]) -> Vec<P> {
    names.iter().map(|n| P::from_name(n).unwrap()).collect()
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_payment_abandoned_at_each_recovery_point_is_finished_with_one_charge(pool: PgPool) {
    let h = harness(pool).await;
    for (n, point) in points(&["started", "payment_created"]).into_iter().enumerate() {
        let key = format!("create-{n}");
        let params = h.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        h.abandon(
            &key,
            operations::CREATE_PAYMENT,
            &value,
            CreatePayment::new(h.ctx.clone(), params),
            point,
        )
        .await;
        let report = h.pass().await;
        assert_eq!(report.completed, 1, "{key}");
        h.assert_finished_and_replayed(&key, operations::CREATE_PAYMENT, &value, 201).await;
        // The completer's attempt is on record: the second, by no request, taking over an
        // expired lease at the point where the crashed process stopped.
        let attempt: (i32, Option<String>, bool, String) = sqlx::query_as(
            "SELECT a.attempt, a.request_id, a.took_over, a.recovery_point
               FROM idempotency_attempts a JOIN idempotency_keys k ON k.id = a.key_id
              WHERE k.idempotency_key = $1",
        )
        .bind(&key)
        .fetch_one(&h.pool)
        .await
        .unwrap();
        assert_eq!(attempt, (2, None, true, point.name().to_owned()), "{key}");
    }
    assert_eq!(h.stats().await["charges_created"], 2, "one charge per payment");
}

/// A key at a point before a call with no call planned there is never guessed at: the phase that
/// moved it there froze the call, so a key without one was written by hand or broken, and a person
/// looks. Nothing is sent to the processor.
#[sqlx::test(migrations = "../../migrations")]
async fn a_key_at_a_call_with_no_planned_call_is_flagged_not_guessed(pool: PgPool) {
    let h = harness(pool).await;
    let payment_id = h.paid("pay-unplanned", CaptureMethod::Manual).await;
    let params = CaptureParams {
        account_id: h.account.clone(),
        payment_id: payment_id.clone(),
        amount_to_capture: None,
    };
    let value = serde_json::to_value(&params).unwrap();
    let point = points(&["capture_started"]).pop().unwrap();
    let op = CapturePayment::new(h.ctx.clone(), params);
    h.abandon("unplanned", operations::CAPTURE_PAYMENT, &value, op, point).await;
    sqlx::query(
        "UPDATE idempotency_keys SET planned_call = NULL WHERE idempotency_key = 'unplanned'",
    )
    .execute(&h.pool)
    .await
    .unwrap();

    let report = h.pass().await;
    assert_eq!((report.completed, report.flagged), (0, 1), "{report:?}");
    let flagged: bool = sqlx::query_scalar(
        "SELECT needs_human_at IS NOT NULL FROM idempotency_keys WHERE idempotency_key = 'unplanned'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!(flagged);
    assert_eq!(h.stats().await["captures"], 0, "no capture at the processor");
}

#[sqlx::test(migrations = "../../migrations")]
async fn captures_cancels_and_refunds_abandoned_at_each_point_are_finished_once(pool: PgPool) {
    let h = harness(pool).await;
    for (n, point) in points(&["started", "capture_started"]).into_iter().enumerate() {
        let payment_id = h.paid(&format!("pay-c{n}"), CaptureMethod::Manual).await;
        let params =
            CaptureParams { account_id: h.account.clone(), payment_id, amount_to_capture: None };
        let value = serde_json::to_value(&params).unwrap();
        let key = format!("capture-{n}");
        h.abandon(
            &key,
            operations::CAPTURE_PAYMENT,
            &value,
            CapturePayment::new(h.ctx.clone(), params),
            point,
        )
        .await;
        assert_eq!(h.pass().await.completed, 1);
        h.assert_finished_and_replayed(&key, operations::CAPTURE_PAYMENT, &value, 200).await;
    }
    for (n, point) in points(&["started", "cancel_started"]).into_iter().enumerate() {
        let payment_id = h.paid(&format!("pay-x{n}"), CaptureMethod::Manual).await;
        let params =
            CancelParams { account_id: h.account.clone(), payment_id, cancellation_reason: None };
        let value = serde_json::to_value(&params).unwrap();
        let key = format!("cancel-{n}");
        h.abandon(
            &key,
            operations::CANCEL_PAYMENT,
            &value,
            CancelPayment::new(h.ctx.clone(), params),
            point,
        )
        .await;
        assert_eq!(h.pass().await.completed, 1);
        h.assert_finished_and_replayed(&key, operations::CANCEL_PAYMENT, &value, 200).await;
    }
    for (n, point) in points(&["started", "refund_created"]).into_iter().enumerate() {
        let payment_id = h.paid(&format!("pay-r{n}"), CaptureMethod::Automatic).await;
        let request = NewRefund { amount: Amount::new(400), ..NewRefund::default() };
        let params = RefundParams { account_id: h.account.clone(), payment_id, request };
        let value = serde_json::to_value(&params).unwrap();
        let key = format!("refund-{n}");
        h.abandon(
            &key,
            operations::CREATE_REFUND,
            &value,
            CreateRefundOp::new(h.ctx.clone(), params),
            point,
        )
        .await;
        assert_eq!(h.pass().await.completed, 1);
        h.assert_finished_and_replayed(&key, operations::CREATE_REFUND, &value, 201).await;
    }
    let stats = h.stats().await;
    assert_eq!(stats["captures"], 2);
    assert_eq!(stats["refunds_created"], 4, "two releases for the cancels, two refunds");
    let statuses: Vec<(String,)> =
        sqlx::query_as("SELECT status FROM payments WHERE capture_method = 'manual' ORDER BY seq")
            .fetch_all(&h.pool)
            .await
            .unwrap();
    let statuses: Vec<&str> = statuses.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(statuses, ["succeeded", "succeeded", "canceled", "canceled"]);
}

#[sqlx::test(migrations = "../../migrations")]
async fn two_completers_racing_over_a_hundred_keys_process_each_once(pool: PgPool) {
    let h = harness(pool).await;
    for n in 0..100 {
        let params = h.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        let op = CreatePayment::new(h.ctx.clone(), params);
        h.abandon(
            &format!("k{n}"),
            operations::CREATE_PAYMENT,
            &value,
            op,
            operations::CreatePoint::Started,
        )
        .await;
    }
    let (a, b) = (h.worker(), h.worker());
    let (_stop_tx, stop) = watch::channel(false);
    let (ra, rb) = tokio::join!(a.run_once(&stop), b.run_once(&stop));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.completed + rb.completed, 100, "{ra:?} {rb:?}");
    assert_eq!(ra.lost + rb.lost, 0);
    let unfinished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE completed_at IS NULL")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(unfinished, 0);
    let charged: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'payment.charged'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(charged, 100, "each payment was charged by exactly one completer");
    assert_eq!(h.stats().await["charges_created"], 100);
}

/// Sets the stand-in processor's faults.
async fn set_faults(sim: &str, faults: Value) {
    reqwest::Client::new()
        .put(format!("{sim}/_sim/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

/// Keys leased right now, by anyone.
async fn leased(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE locked_until > now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A multiplier of key counts; `PROOF_SCALE` raises it for longer runs (`make proof`).
fn scale() -> usize {
    std::env::var("PROOF_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

#[sqlx::test(migrations = "../../migrations")]
async fn the_completer_holds_a_lease_only_on_the_key_it_is_driving(pool: PgPool) {
    let h = harness(pool).await;
    for n in 0..5 {
        let params = h.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        let op = CreatePayment::new(h.ctx.clone(), params);
        h.abandon(
            &format!("k{n}"),
            operations::CREATE_PAYMENT,
            &value,
            op,
            operations::CreatePoint::Started,
        )
        .await;
    }
    set_faults(&h.sim, json!({"latency_ms": 300})).await;
    let (_stop_tx, stop) = watch::channel(false);
    let worker = h.worker();
    let pass = tokio::spawn(async move { worker.run_once(&stop).await });
    // Inside the first processor call: the four keys behind it are nobody's yet.
    let calling = || async { h.stats().await["requests"].as_u64().unwrap_or(0) > 0 };
    eventually("the worker's first processor call", WAIT, calling).await;
    assert_eq!(leased(&h.pool).await, 1, "only the key being driven is leased");
    let report = pass.await.unwrap().unwrap();
    assert_eq!((report.completed, report.lost), (5, 0), "{report:?}");
    assert_eq!(leased(&h.pool).await, 0);
}

#[sqlx::test(migrations = "../../migrations")]
async fn two_workers_over_a_brown_out_processor_drive_each_key_by_one_holder_at_a_time(
    pool: PgPool,
) {
    // Calls take about as long as the client waits (some time out), and the lease is as short
    // as the start-up check allows: a batch leased at once would outlive its leases.
    let h = harness_with(
        pool,
        &[
            ("PAYMENTS__PROCESSOR__CONNECT_TIMEOUT_MS", "100"),
            ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "250"),
            ("PAYMENTS__PROCESSOR__MAX_RETRIES", "0"),
            ("PAYMENTS__IDEMPOTENCY__LEASE_MS", "5400"),
        ],
    )
    .await;
    let keys = 100 * scale();
    for n in 0..keys {
        let params = h.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        let op = CreatePayment::new(h.ctx.clone(), params);
        h.abandon(
            &format!("k{n}"),
            operations::CREATE_PAYMENT,
            &value,
            op,
            operations::CreatePoint::PaymentCreated,
        )
        .await;
    }
    set_faults(&h.sim, json!({"latency_ms": 180, "jitter_ms": 100})).await;
    let (a, b) = (h.worker(), h.worker());
    let (stop_tx, stop) = watch::channel(false);
    let sampler = {
        let (pool, stop) = (h.pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while !*stop.borrow() {
                most = most.max(leased(&pool).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            most
        })
    };
    let mut total = PassReport::default();
    for _ in 0..30 {
        let (ra, rb) = tokio::join!(a.run_once(&stop), b.run_once(&stop));
        for report in [ra.unwrap(), rb.unwrap()] {
            total.completed += report.completed;
            total.released += report.released;
            total.lost += report.lost;
            total.flagged += report.flagged;
        }
        let unfinished: i64 =
            sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE completed_at IS NULL")
                .fetch_one(&h.pool)
                .await
                .unwrap();
        if unfinished == 0 {
            break;
        }
        // Bring the back-off of keys whose call timed out forward instead of sleeping through it.
        sqlx::query(
            "UPDATE idempotency_keys SET next_attempt_at = now() WHERE completed_at IS NULL",
        )
        .execute(&h.pool)
        .await
        .unwrap();
    }
    stop_tx.send(true).unwrap();
    let most_leased = sampler.await.unwrap();
    assert_eq!(total.completed, keys as u64, "{total:?}");
    assert_eq!((total.lost, total.flagged), (0, 0), "no key was taken from a worker driving it");
    assert!(most_leased <= 2, "at most one key per worker is leased at a time: {most_leased}");
    // Every lease the completers took is on record, and each was driven before the next was
    // taken: one attempt row per drive, none left over.
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_attempts")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(attempts as u64, total.completed + total.released, "{total:?}");
    let charged: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'payment.charged'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(charged as usize, keys, "one charge per payment");
    assert_eq!(h.stats().await["charges_created"], keys as u64);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_key_completed_late_is_kept_for_the_whole_retention_after_its_completion(pool: PgPool) {
    let h = harness(pool).await;
    h.paid("late", CaptureMethod::Automatic).await;
    h.paid("early", CaptureMethod::Automatic).await;
    // Both were created long ago; "late" was finished by the completer an hour ago.
    sqlx::query(
        "UPDATE idempotency_keys SET created_at = now() - interval '30 hours',
                completed_at = CASE idempotency_key WHEN 'late' THEN now() - interval '1 hour'
                                                    ELSE now() - interval '25 hours' END",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    assert_eq!(h.pass().await.reaped, 1);
    let keys: Vec<String> = sqlx::query_scalar("SELECT idempotency_key FROM idempotency_keys")
        .fetch_all(&h.pool)
        .await
        .unwrap();
    assert_eq!(keys, ["late"], "retention counts from completion");
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_key_past_the_processor_window_is_flagged_not_retried(pool: PgPool) {
    let h = harness(pool).await;
    let params = h.create_params(CaptureMethod::Automatic, None);
    let value = serde_json::to_value(&params).unwrap();
    let op = CreatePayment::new(h.ctx.clone(), params);
    h.abandon(
        "old",
        operations::CREATE_PAYMENT,
        &value,
        op,
        operations::CreatePoint::PaymentCreated,
    )
    .await;
    sqlx::query("UPDATE idempotency_keys SET created_at = now() - interval '21 hours'")
        .execute(&h.pool)
        .await
        .unwrap();

    let report = h.pass().await;
    assert_eq!((report.completed, report.flagged), (0, 1));
    assert_eq!(h.key_row("old").await, ("payment_created".into(), None, true));
    assert_eq!(h.stats().await["requests"], 0, "the processor was never called");
    assert!(matches!(h.claim("old", operations::CREATE_PAYMENT, &value).await, Claim::NeedsHuman));
    assert_eq!(h.pass().await, PassReport::default(), "a flagged key is never taken again");
    let stuck = idem::stuck_keys(&h.pool, 10).await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert!(stuck[0].last_error.as_deref().unwrap().contains("idempotency window"));
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_key_that_keeps_failing_is_flagged_after_the_attempt_bound(pool: PgPool) {
    let h = harness(pool).await;
    let params = h.create_params(CaptureMethod::Automatic, None);
    let value = serde_json::to_value(&params).unwrap();
    let op = CreatePayment::new(h.ctx.clone(), params);
    h.abandon(
        "flaky",
        operations::CREATE_PAYMENT,
        &value,
        op,
        operations::CreatePoint::PaymentCreated,
    )
    .await;
    // The completer's own runs: a client's retries never count against the bound (below).
    sqlx::query("UPDATE idempotency_keys SET completer_attempts = $1")
        .bind(h.settings.worker.max_attempts as i32)
        .execute(&h.pool)
        .await
        .unwrap();
    assert_eq!(h.pass().await.flagged, 1);
    assert!(h.key_row("flaky").await.2);
}

impl Harness {
    /// A client's retry of `key`: the claim resumes the released key and drives it, as the API
    /// does; the processor is down, so it is released again (the client gets a 503).
    async fn client_retry_fails(&self, key: &str, params: &CreatePaymentParams) {
        let value = serde_json::to_value(params).unwrap();
        let Claim::Acquired(lease) = self.claim(key, operations::CREATE_PAYMENT, &value).await
        else {
            panic!("a released key is resumed")
        };
        let op = &mut CreatePayment::new(self.ctx.clone(), params.clone());
        match idem::drive(op, lease).await {
            Err(idem::Interrupted::Transient { .. }) => {}
            other => panic!("expected a transient failure, got {other:?}"),
        }
    }

    /// `attempts` and `completer_attempts` of `key`.
    async fn attempt_counts(&self, key: &str) -> (i32, i32) {
        sqlx::query_as(
            "SELECT attempts, completer_attempts FROM idempotency_keys WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Makes every unfinished key due now (the back-off is not under test).
    async fn make_due(&self) {
        sqlx::query(
            "UPDATE idempotency_keys SET next_attempt_at = now() WHERE completed_at IS NULL",
        )
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

impl Harness {
    /// A payment abandoned at `payment_created` under `key` while the processor refuses every
    /// call (429): its input, and the input as stored.
    async fn abandoned_in_an_outage(&self, key: &str) -> (CreatePaymentParams, Value) {
        let params = self.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        let op = CreatePayment::new(self.ctx.clone(), params.clone());
        let point = operations::CreatePoint::PaymentCreated;
        self.abandon(key, operations::CREATE_PAYMENT, &value, op, point).await;
        set_faults(&self.sim, json!({"rate_limit_rate": 1.0})).await;
        (params, value)
    }
}

/// The processor is down for a while; the client retries the same key more often than the
/// completer's bound, each retry resuming the key and getting a 503; the client stops; the
/// processor recovers. The completer then drives the key to its answer, with one charge, instead
/// of flagging it for a person on first sight: client retries spend none of its attempts.
#[sqlx::test(migrations = "../../migrations")]
async fn client_retries_through_an_outage_leave_the_completer_its_attempts(pool: PgPool) {
    let h = harness_with(pool, &[("PAYMENTS__WORKER__MAX_ATTEMPTS", "3")]).await;
    let max = h.settings.worker.max_attempts;
    let (params, value) = h.abandoned_in_an_outage("outage").await;
    for _ in 0..=max {
        h.client_retry_fails("outage", &params).await;
    }
    assert_eq!(h.attempt_counts("outage").await, (max as i32 + 2, 0));

    set_faults(&h.sim, json!({})).await;
    h.make_due().await;
    let report = h.pass().await;
    assert_eq!((report.completed, report.flagged), (1, 0), "{report:?}");
    h.assert_finished_and_replayed("outage", operations::CREATE_PAYMENT, &value, 201).await;
    assert_eq!(h.attempt_counts("outage").await, (max as i32 + 3, 1));
    assert_eq!(h.stats().await["charges_created"], 1);
}

/// The completer's own failures still end in the flag: after `max_attempts` runs of its own, the
/// next time it takes the key it flags it for a person, whatever the client did in between.
#[sqlx::test(migrations = "../../migrations")]
async fn the_completer_flags_a_key_after_its_own_attempts(pool: PgPool) {
    let h = harness_with(pool, &[("PAYMENTS__WORKER__MAX_ATTEMPTS", "3")]).await;
    let max = h.settings.worker.max_attempts;
    let (params, value) = h.abandoned_in_an_outage("down").await;
    for run in 1..=max {
        h.client_retry_fails("down", &params).await;
        h.make_due().await;
        let report = h.pass().await;
        assert_eq!((report.released, report.flagged), (1, 0), "run {run}: {report:?}");
    }
    h.make_due().await;
    assert_eq!(h.pass().await.flagged, 1);
    assert!(h.key_row("down").await.2);
    assert_eq!(h.attempt_counts("down").await, (2 * max as i32 + 2, max as i32 + 1));
    let stuck = idem::stuck_keys(&h.pool, 10).await.unwrap();
    assert!(
        stuck[0].last_error.as_deref().unwrap().contains("gave up after 3 attempts"),
        "{stuck:?}"
    );
    assert!(matches!(h.claim("down", operations::CREATE_PAYMENT, &value).await, Claim::NeedsHuman));
    assert_eq!(h.stats().await["charges_created"], 0);
}

#[sqlx::test(migrations = "../../migrations")]
async fn the_reaper_removes_only_completed_keys_past_retention_and_keeps_payments(pool: PgPool) {
    let h = harness(pool).await;
    let old_payment = h.paid("old-done", CaptureMethod::Automatic).await;
    h.paid("new-done", CaptureMethod::Automatic).await;
    let params = h.create_params(CaptureMethod::Automatic, None);
    let value = serde_json::to_value(&params).unwrap();
    let op = CreatePayment::new(h.ctx.clone(), params);
    h.abandon(
        "old-unfinished",
        operations::CREATE_PAYMENT,
        &value,
        op,
        operations::CreatePoint::Started,
    )
    .await;
    sqlx::query("UPDATE idempotency_keys SET created_at = now() - interval '25 hours', completed_at = CASE WHEN completed_at IS NOT NULL THEN now() - interval '25 hours' END, needs_human_at = NULL WHERE idempotency_key LIKE 'old-%'")
        .execute(&h.pool)
        .await
        .unwrap();
    // Keep the completer off the unfinished one: this test is about the reaper alone.
    sqlx::query("UPDATE idempotency_keys SET next_attempt_at = now() + interval '1 hour' WHERE idempotency_key = 'old-unfinished'")
        .execute(&h.pool)
        .await
        .unwrap();

    let report = h.pass().await;
    assert_eq!(report.reaped, 1);
    let keys: Vec<(String,)> =
        sqlx::query_as("SELECT idempotency_key FROM idempotency_keys ORDER BY idempotency_key")
            .fetch_all(&h.pool)
            .await
            .unwrap();
    assert_eq!(
        keys.iter().map(|k| k.0.as_str()).collect::<Vec<_>>(),
        ["new-done", "old-unfinished"]
    );
    assert!(
        h.key_row("old-unfinished").await.2,
        "an unfinished key past retention is flagged, not deleted"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM payments WHERE id = $1")
        .bind(&old_payment)
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(status, "succeeded", "the payment outlives its key");
    // A reuse of a reaped key is a new request.
    assert!(matches!(
        h.claim("old-done", operations::CREATE_PAYMENT, &json!({"other": 1})).await,
        Claim::Acquired(_)
    ));
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_failing_job_is_retried_then_dead_lettered(pool: PgPool) {
    let h = harness(pool).await;
    h.mailer.failing.store(true, Ordering::SeqCst);
    h.paid_with_receipt("with-receipt").await;

    let mut reports = Vec::new();
    for _ in 0..3 {
        reports.push(h.pass().await);
        // Bring the retry forward instead of sleeping through the back-off.
        sqlx::query("UPDATE jobs SET run_at = now()").execute(&h.pool).await.unwrap();
    }
    assert_eq!(
        reports.iter().map(|r| (r.jobs_retried, r.jobs_dead)).collect::<Vec<_>>(),
        [(1, 0), (1, 0), (0, 1)]
    );
    let (attempts, dead, error): (i32, bool, String) =
        sqlx::query_as("SELECT attempts, dead_at IS NOT NULL, last_error FROM jobs")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!((attempts, dead, error.as_str()), (3, true, "smtp server unreachable"));
    assert_eq!(h.pass().await.jobs_done, 0, "a dead job stays dead");
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_receipt_job_that_runs_twice_sends_one_receipt(pool: PgPool) {
    let h = harness(pool).await;
    h.paid_with_receipt("with-receipt").await;

    assert_eq!(h.pass().await.jobs_done, 1);
    // As if the worker had died after sending and before marking the job done.
    sqlx::query("UPDATE jobs SET done_at = NULL, run_at = now()").execute(&h.pool).await.unwrap();
    assert_eq!(h.pass().await.jobs_done, 1);
    assert_eq!(h.mailer.sent.load(Ordering::SeqCst), 1);
    let (receipts, body): (i64, String) =
        sqlx::query_as("SELECT count(*) OVER (), body FROM receipts")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(receipts, 1);
    assert!(body.contains("10.00 USD"), "{body}");
}

/// Counts receipts; holds the first one inside its send (saying so on `entered`) until `go`.
#[derive(Default)]
struct FirstSendWaits {
    sent: AtomicUsize,
    entered: tokio::sync::Notify,
    go: tokio::sync::Notify,
}

impl Mailer for FirstSendWaits {
    fn send<'a>(&'a self, _receipt: &'a Receipt) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if self.sent.fetch_add(1, Ordering::SeqCst) == 0 {
                self.entered.notify_one();
                self.go.notified().await;
            }
            Ok(())
        })
    }
}

/// Two runs of one payment's receipt job at once: the second finds the first one's send held and
/// sends nothing (it fails, to look again later), so the receipt goes out once.
#[sqlx::test(migrations = "../../migrations")]
async fn two_runs_of_one_receipt_job_at_once_send_it_once(pool: PgPool) {
    let h = harness(pool).await;
    h.paid_with_receipt("with-receipt").await;
    let payload: Value = sqlx::query_scalar("SELECT payload FROM jobs WHERE kind = 'receipt'")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    let job: ReceiptJob = serde_json::from_value(payload).unwrap();
    let mailer = Arc::new(FirstSendWaits::default());
    let sender = Arc::new(ReceiptSender::new(mailer.clone(), &h.settings.worker));

    let first = tokio::spawn({
        let (pool, sender, job) = (h.pool.clone(), sender.clone(), job.clone());
        async move { sender.send(&pool, &job).await }
    });
    mailer.entered.notified().await;
    let second = sender.send(&h.pool, &job).await;
    assert!(second.is_err(), "the second run waits for the first: {second:?}");
    mailer.go.notify_one();
    assert_eq!(first.await.unwrap(), Ok(ReceiptOutcome::Sent));
    let later = sender.send(&h.pool, &job).await;
    assert_eq!(later, Ok(ReceiptOutcome::Settled));
    assert_eq!(mailer.sent.load(Ordering::SeqCst), 1, "one send for one payment");
}

/// What became of each receipt, by address: whether it was sent, and why not.
async fn receipt_rows(pool: &PgPool) -> Vec<(String, bool, Option<String>)> {
    sqlx::query_as(
        "SELECT email, sent_at IS NOT NULL, not_sent_reason FROM receipts ORDER BY created_at, email",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// In test mode a receipt goes only to an address the account verified: to another, it is
/// recorded (rendered as it would have gone) and withheld for good, and its job is done.
#[sqlx::test(migrations = "../../migrations")]
async fn a_receipt_to_an_address_the_account_did_not_verify_is_recorded_not_sent(pool: PgPool) {
    let h = harness(pool).await;
    h.paid_with_receipt_to("to-a-stranger", "victim@elsewhere.example").await;
    h.paid_with_receipt_to("to-its-own", "JO@example.com").await;

    let report = h.pass().await;
    assert_eq!((report.jobs_done, report.jobs_retried), (2, 0), "{report:?}");
    assert_eq!(h.mailer.sent.load(Ordering::SeqCst), 1, "only the verified address got one");
    let rows = receipt_rows(&h.pool).await;
    assert_eq!(
        rows,
        [
            ("victim@elsewhere.example".into(), false, Some("unverified_recipient".into())),
            ("JO@example.com".into(), true, None),
        ]
    );
    let body: String =
        sqlx::query_scalar("SELECT body FROM receipts WHERE email = 'victim@elsewhere.example'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert!(body.contains("10.00 USD"), "recorded as it would have gone: {body}");

    // Withheld for good: verifying the address later sends nothing for it, and no job is left.
    payments_domain::accounts::verify_email(&h.pool, &h.account, "victim@elsewhere.example")
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET done_at = NULL, run_at = now()").execute(&h.pool).await.unwrap();
    assert_eq!(h.pass().await.jobs_done, 2);
    assert_eq!(h.mailer.sent.load(Ordering::SeqCst), 1);
}

/// An account's receipts beyond its hourly quota are recorded and withheld, not retried; another
/// account's receipts still go, and so do the first account's once its earlier ones are an hour
/// old.
#[sqlx::test(migrations = "../../migrations")]
async fn receipts_beyond_an_accounts_hourly_quota_are_recorded_not_sent(pool: PgPool) {
    let mut h =
        harness_with(pool, &[("PAYMENTS__WORKER__RECEIPTS_PER_ACCOUNT_PER_HOUR", "2")]).await;
    for n in 0..3 {
        h.paid_with_receipt(&format!("receipt-{n}")).await;
    }
    let report = h.pass().await;
    assert_eq!((report.jobs_done, report.jobs_retried, report.jobs_dead), (3, 0, 0));
    assert_eq!(h.mailer.sent.load(Ordering::SeqCst), 2);
    let reasons: Vec<Option<String>> =
        receipt_rows(&h.pool).await.into_iter().map(|(_, _, reason)| reason).collect();
    assert_eq!(reasons.iter().filter(|r| r.as_deref() == Some("quota_exceeded")).count(), 1);

    // Another account has its own quota.
    let (other, _, _) =
        payments_domain::accounts::create_account(&h.pool, "other shop").await.unwrap();
    payments_domain::accounts::verify_email(&h.pool, &other.id, "jo@example.com").await.unwrap();
    let first = std::mem::replace(&mut h.account, other.id);
    h.paid_with_receipt("other-0").await;
    assert_eq!(h.pass().await.jobs_done, 1);
    assert_eq!(h.mailer.sent.load(Ordering::SeqCst), 3, "another account's receipt went");

    // An hour later the first account's quota has room again.
    sqlx::query("UPDATE receipts SET admitted_at = admitted_at - interval '61 minutes'")
        .execute(&h.pool)
        .await
        .unwrap();
    h.account = first;
    h.paid_with_receipt("receipt-later").await;
    assert_eq!(h.pass().await.jobs_done, 1);
    assert_eq!(h.mailer.sent.load(Ordering::SeqCst), 4);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_stop_mid_pass_finishes_the_item_in_hand_and_gives_back_the_rest(pool: PgPool) {
    let h = harness(pool).await;
    for n in 0..5 {
        let params = h.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        let op = CreatePayment::new(h.ctx.clone(), params);
        h.abandon(
            &format!("k{n}"),
            operations::CREATE_PAYMENT,
            &value,
            op,
            operations::CreatePoint::Started,
        )
        .await;
    }
    set_faults(&h.sim, json!({"latency_ms": 300})).await;
    let (stop_tx, stop) = watch::channel(false);
    let worker = h.worker();
    let pass = tokio::spawn(async move { worker.run_once(&stop).await });
    // Stop once the first item is in hand: inside its processor call.
    let calling = || async { h.stats().await["requests"].as_u64().unwrap_or(0) > 0 };
    eventually("the worker's first processor call", WAIT, calling).await;
    stop_tx.send(true).unwrap();
    let report = pass.await.unwrap().unwrap();
    assert_eq!(report.completed, 1, "the item in hand was finished: {report:?}");
    let (finished, leased): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE completed_at IS NOT NULL), count(*) FILTER (WHERE locked_until > now()) FROM idempotency_keys",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!((finished, leased), (1, 0), "nothing is left leased to a stopped worker");
}

/// Through a processor outage the completer can spend a long time on each due key. Receipts
/// (and webhook deliveries, the same job queue) and the reaper run beside it, not behind it.
#[sqlx::test(migrations = "../../migrations")]
async fn jobs_do_not_wait_behind_a_completer_stuck_in_slow_calls(pool: PgPool) {
    let h = harness(pool).await;
    // A receipt staged by a payment made in one go.
    h.paid_with_receipt("with-receipt").await;
    // A key the completer must finish with a call, and a processor that takes its time.
    h.abandoned_before_the_call("k").await;
    set_faults(&h.sim, json!({"latency_ms": 3000})).await;

    let (stop_tx, stop) = watch::channel(false);
    let worker = h.worker();
    let running = tokio::spawn(async move { worker.run_until(stop).await });
    let sent = tokio::time::timeout(Duration::from_millis(2000), async {
        while h.mailer.sent.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let key_unfinished: bool = sqlx::query_scalar(
        "SELECT completed_at IS NULL FROM idempotency_keys WHERE idempotency_key = 'k'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!(sent.is_ok(), "the receipt waited behind the completer's call");
    assert!(key_unfinished, "the completer's call was still on its way");
    stop_tx.send(true).unwrap();
    running.await.unwrap();
    assert_eq!(h.key_row("k").await, ("finished".into(), Some(201), false));
}

#[sqlx::test(migrations = "../../migrations")]
async fn sigterm_mid_pass_exits_cleanly_without_losing_the_item(pool: PgPool) {
    let h = harness(pool).await;
    h.abandoned_before_the_call("k").await;
    set_faults(&h.sim, json!({"latency_ms": 800})).await;

    let options = h.pool.connect_options();
    let url = format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap()
    );
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments-worker"))
        .env("DATABASE_URL", url)
        .env("PAYMENTS__PROCESSOR__BASE_URL", &h.sim)
        .env("PAYMENTS__LOG__FILTER", "warn")
        .env("PAYMENTS__WEBHOOKS__SEALING_KEY", "5e".repeat(32))
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Wait until the worker is inside the processor call.
    let calling = || async { h.stats().await["requests"].as_u64().unwrap_or(0) > 0 };
    eventually("the worker process's processor call", WAIT, calling).await;
    assert_eq!(h.stats().await["requests"], 1);
    let pid = child.id().unwrap().to_string();
    let killed = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("it exits")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        h.key_row("k").await,
        ("finished".into(), Some(201), false),
        "the item in hand was finished"
    );
    assert_eq!(h.stats().await["charges_created"], 1);
}

/// A loopback SMTP server that speaks just enough for lettre, keeps every message it accepted,
/// and holds its answer to the first message's data until `release` is notified.
struct StallingSmtp {
    url: String,
    messages: Arc<std::sync::Mutex<Vec<String>>>,
    first_data: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

async fn stalling_smtp() -> StallingSmtp {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("smtp://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let messages = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first_data = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let server = StallingSmtp {
        url,
        messages: messages.clone(),
        first_data: first_data.clone(),
        release: release.clone(),
    };
    tokio::spawn(async move {
        let connections = Arc::new(AtomicUsize::new(0));
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let stall = connections.fetch_add(1, Ordering::SeqCst) == 0;
            let (messages, first_data, release) =
                (messages.clone(), first_data.clone(), release.clone());
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 stalling ESMTP\r\n").await.unwrap();
                while let Ok(Some(line)) = lines.next_line().await {
                    let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
                    let reply: &[u8] = match verb.as_str() {
                        "EHLO" | "HELO" => b"250 stalling\r\n",
                        "DATA" => {
                            write.write_all(b"354 go on\r\n").await.unwrap();
                            let mut message = String::new();
                            while let Ok(Some(line)) = lines.next_line().await {
                                if line == "." {
                                    break;
                                }
                                message.push_str(&line);
                                message.push('\n');
                            }
                            messages.lock().unwrap().push(message);
                            if stall {
                                first_data.notify_one();
                                release.notified().await;
                            }
                            b"250 queued\r\n"
                        }
                        "QUIT" => {
                            let _ = write.write_all(b"221 bye\r\n").await;
                            break;
                        }
                        _ => b"250 ok\r\n",
                    };
                    if write.write_all(reply).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    server
}

/// Two runners of one receipt job at once (the job's claim taken over while its first run still
/// sends): the second sends no copy beside the first. Once the first run's hold of the send has
/// run out (as after a crash between the send and its record: the one window in which a receipt
/// goes out twice), a later run sends it again, and both copies carry the one `Message-ID`.
#[sqlx::test(migrations = "../../migrations")]
async fn a_receipt_sent_again_after_its_hold_ran_out_carries_one_message_id(pool: PgPool) {
    let h = harness(pool).await;
    let smtp = stalling_smtp().await;
    let answer = h.paid_with_receipt("with-receipt").await;
    let payment: Value = serde_json::from_slice(&answer.body).unwrap();
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    let runner = || {
        let mailer = SmtpMailer::new(&smtp.url, "Payments <receipts@example.com>").unwrap();
        Worker::new(
            h.pool.clone(),
            h.ctx.processor.clone(),
            "http://test".into(),
            &h.settings,
            Arc::new(mailer),
        )
        .unwrap()
    };
    let (first, second) = (runner(), runner());
    let (_stop_tx, stop) = watch::channel(false);

    // The first runner's send stalls after the server has the message.
    let stop_first = stop.clone();
    let stalled = tokio::spawn(async move {
        let mut report = PassReport::default();
        first.run_jobs(&stop_first, &mut report).await.unwrap();
        report
    });
    smtp.first_data.notified().await;
    // Its claim of the job runs out: a second runner takes the job, finds the send held, and
    // leaves it for later.
    sqlx::query("UPDATE jobs SET run_at = now()").execute(&h.pool).await.unwrap();
    let mut again = PassReport::default();
    second.run_jobs(&stop, &mut again).await.unwrap();
    assert_eq!((again.jobs_done, again.jobs_retried), (0, 1), "{again:?}");
    assert_eq!(smtp.messages.lock().unwrap().len(), 1, "no copy beside the send in flight");

    // The first run's hold runs out, as if it had died mid-send: the next run sends again.
    sqlx::query("UPDATE receipts SET sending_until = now() - interval '1 second'")
        .execute(&h.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET run_at = now()").execute(&h.pool).await.unwrap();
    let mut last = PassReport::default();
    second.run_jobs(&stop, &mut last).await.unwrap();
    assert_eq!(last.jobs_done, 1, "{last:?}");
    smtp.release.notify_one();
    let stalled = stalled.await.unwrap();
    assert_eq!(stalled.jobs_done, 0, "the runner whose claim was taken over records nothing");

    let (receipts, sent): (i64, bool) =
        sqlx::query_as("SELECT count(*) OVER (), sent_at IS NOT NULL FROM receipts")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!((receipts, sent), (1, true), "one receipt row, sent");
    let (attempts, done): (i32, bool) =
        sqlx::query_as("SELECT attempts, done_at IS NOT NULL FROM jobs")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!((attempts, done), (3, true));
    let expected = payments_worker::jobs::message_id(&payment_id, "example.com");
    let messages = smtp.messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 2, "delivery is at least once: the email went out twice");
    for message in &messages {
        let ids: Vec<&str> =
            message.lines().filter_map(|l| l.strip_prefix("Message-ID: ")).collect();
        assert_eq!(ids, [expected.as_str()], "every copy carries the receipt's Message-ID");
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn the_completer_knows_every_operation_name_and_flags_an_unknown_one(pool: PgPool) {
    let h = harness(pool).await;
    let unparseable = json!({"not": "the input of any operation"});
    let resumable = operations::resumable();
    assert_eq!(resumable.len(), 7);
    for (n, name) in resumable.into_iter().chain(["payments.refund"]).enumerate() {
        let Claim::Acquired(lease) = h.claim(&format!("k{n}"), name, &unparseable).await else {
            panic!("new key")
        };
        let reason = match operations::resume(&h.ctx, lease).await {
            Err(idem::Interrupted::NeedsHuman { reason }) => reason,
            other => panic!("{name}: expected a flag, got {other:?}"),
        };
        let expected = match name {
            "payments.refund" => "unknown operation `payments.refund`",
            _ => "stored parameters do not parse",
        };
        assert!(reason.starts_with(expected), "{name}: {reason}");
    }
}

/// During a rolling deploy a key can belong to an operation only the newer release knows. A
/// completer of the older release leaves it alone (neither takes nor flags it) for a completer
/// that can drive it, and still finishes the keys it knows.
#[sqlx::test(migrations = "../../migrations")]
async fn the_completer_leaves_a_key_of_an_operation_it_does_not_know_to_one_that_does(
    pool: PgPool,
) {
    let h = harness(pool).await;
    for key in ["known", "newer"] {
        let params = h.create_params(CaptureMethod::Automatic, None);
        let value = serde_json::to_value(&params).unwrap();
        h.abandon(
            key,
            operations::CREATE_PAYMENT,
            &value,
            CreatePayment::new(h.ctx.clone(), params),
            points(&["payment_created"]).pop().unwrap(),
        )
        .await;
    }
    // As if a newer release had started it under an operation this one does not resume.
    sqlx::query("UPDATE idempotency_keys SET operation = 'payments.create_v2' WHERE idempotency_key = 'newer'")
        .execute(&h.pool)
        .await
        .unwrap();
    let report = h.pass().await;
    assert_eq!((report.completed, report.flagged), (1, 0), "{report:?}");
    assert_eq!(h.key_row("known").await, ("finished".into(), Some(201), false));
    let newer: (String, bool, i32, i32) = sqlx::query_as(
        "SELECT recovery_point, needs_human_at IS NOT NULL, attempts, completer_attempts
           FROM idempotency_keys WHERE idempotency_key = 'newer'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(newer, ("payment_created".into(), false, 1, 0), "untouched, not flagged");
}
