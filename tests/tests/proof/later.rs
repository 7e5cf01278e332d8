//! The fault matrix's rows for outcomes that arrive after the request is over (3-D Secure): the
//! real binaries as processes, the stand-in's webhooks to the API, crashes at failpoints, and
//! webhooks lost, duplicated and out of order. Each payment's outcome is recorded once, with one
//! event; the create's key answers the same whatever happened; no card is charged twice.

use std::time::Duration;

use payments_tests::system::{Account, Process, System, scale};
use serde_json::{Value, json};

/// The secret the stand-in signs its webhooks with, and the API verifies them with.
const SECRET: &str = "whsec_proof_later";

/// Settings of every API and worker here: the processor's webhooks verified, and a payment that
/// waits on its customer asked after a second after its create.
const LATER: [(&str, &str); 2] = [
    ("PAYMENTS__PROCESSOR__WEBHOOK_SECRET", SECRET),
    ("PAYMENTS__PROCESSOR__AUTHENTICATION_CHECK_AFTER_S", "1"),
];

fn three_ds() -> Value {
    json!({"amount": 900, "currency": "usd", "payment_method": "pm_card_threeDSecure2Required"})
}

/// Sends the stand-in's webhooks to `api` (`None`: to nobody, lost for good).
async fn webhooks_to(sys: &System, api: Option<&Process>) {
    let target =
        api.map(|api| json!({"url": format!("{}/webhooks/processor", api.url), "secret": SECRET}));
    let url = format!("{}/_sim/webhooks", sys.sim.url);
    let set = sys.http.put(url).json(&target.unwrap_or(Value::Null)).send().await.unwrap();
    assert_eq!(set.status(), 200);
}

/// Completes or fails a customer's authentication at the stand-in.
async fn authenticate(sys: &System, intent: &str, outcome: &str) {
    let url = format!("{}/_sim/payment_intents/{intent}/authenticate", sys.sim.url);
    let done = sys.http.post(url).json(&json!({"outcome": outcome})).send().await.unwrap();
    assert_eq!(done.status(), 200);
}

/// A payment that waits on its customer, created through `api` under `key`: its answer's body,
/// its id and its PaymentIntent.
async fn waiting(
    sys: &System,
    api: &str,
    account: &Account,
    key: &str,
) -> (Vec<u8>, String, String) {
    let (status, body) =
        sys.post_until_final(api, account, "/v1/payments", key, &three_ds(), 20).await.unwrap();
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let payment: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payment["status"], "requires_action", "{payment}");
    let intent = payment["processor_payment_intent_id"].as_str().unwrap().to_owned();
    (body, payment["id"].as_str().unwrap().to_owned(), intent)
}

async fn status(sys: &System, id: &str) -> String {
    sqlx::query_scalar("SELECT status FROM payments WHERE id = $1")
        .bind(id)
        .fetch_one(&sys.pool)
        .await
        .unwrap()
}

/// Waits (at most fifteen seconds) until payment `id` is no longer `requires_action`.
async fn settled(sys: &System, id: &str) -> String {
    for _ in 0..300 {
        let now = status(sys, id).await;
        if now != "requires_action" {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} still waits");
}

/// The events of payment `id`, by type, in order.
async fn events(sys: &System, id: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT type FROM events WHERE object->>'id' = $1 ORDER BY seq")
        .bind(id)
        .fetch_all(&sys.pool)
        .await
        .unwrap()
}

/// The invariants of a settled payment: one event for its wait and one for its outcome, none
/// audited as an extra charge, at most one charge at the processor (one when `charged`), and the
/// create's key answering its first answer.
async fn once(
    sys: &System,
    api: &str,
    account: &Account,
    key: &str,
    first: &[u8],
    id: &str,
    outcome: &str,
) {
    assert_eq!(
        events(sys, id).await,
        ["payment.requires_action".to_owned(), format!("payment.{outcome}")]
    );
    let extra: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE object_id = $1 AND action = 'payment.extra_charge'",
    )
    .bind(id)
    .fetch_one(&sys.pool)
    .await
    .unwrap();
    assert_eq!(extra, 0);
    let charges = sys.charges().await;
    let of = charges.iter().filter(|c| c["metadata"]["payment_id"] == id).count();
    assert_eq!(of, usize::from(outcome == "succeeded"), "{id}'s charges");
    let (status, replay) =
        sys.post_until_final(api, account, "/v1/payments", key, &three_ds(), 5).await.unwrap();
    assert_eq!((status, replay.as_slice()), (201, first), "the create's first answer");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_crash_between_a_webhooks_arrival_and_its_record_loses_no_outcome(pool: sqlx::PgPool) {
    let sys = System::start(pool).await;
    let account = sys.account("later").await;
    let healthy = sys.api_with("", &LATER).await;
    for n in 0..scale() {
        let mut doomed = sys.api_with("processor_events.receive.before_commit=pause", &LATER).await;
        let key = format!("crash-{n}");
        let (first, id, intent) = waiting(&sys, &healthy.url, &account, &key).await;
        webhooks_to(&sys, Some(&doomed)).await;
        authenticate(&sys, &intent, "complete").await;
        let failpoint = "FAILPOINT processor_events.receive.before_commit";
        assert!(doomed.wait_for(failpoint, Duration::from_secs(20)).await, "no webhook came");
        doomed.kill9().await;
        assert_eq!(status(&sys, &id).await, "requires_action", "the record went with the crash");
        // The processor may deliver again to a healthy server; if it does not, the job asks.
        webhooks_to(&sys, Some(&healthy)).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(sys.worker_once_with(&LATER).await.success());
        assert_eq!(settled(&sys, &id).await, "succeeded");
        once(&sys, &healthy.url, &account, &key, &first, &id, "succeeded").await;
        webhooks_to(&sys, None).await;
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_webhook_before_the_creates_last_phase_is_adopted_without_another_call(
    pool: sqlx::PgPool,
) {
    let sys = System::start(pool).await;
    let account = sys.account("later").await;
    let healthy = sys.api_with("", &LATER).await;
    for n in 0..scale() {
        let mut doomed = sys.api_with("payments.create.after_call=pause", &LATER).await;
        webhooks_to(&sys, Some(&doomed)).await;
        let key = format!("early-{n}");
        let pending = {
            let (sys_http, url, secret, key) =
                (sys.http.clone(), doomed.url.clone(), account.secret.clone(), key.clone());
            tokio::spawn(async move {
                sys_http
                    .post(format!("{url}/v1/payments"))
                    .bearer_auth(secret)
                    .header("idempotency-key", key)
                    .json(&three_ds())
                    .timeout(Duration::from_secs(20))
                    .send()
                    .await
            })
        };
        assert!(
            doomed.wait_for("FAILPOINT payments.create.after_call", Duration::from_secs(20)).await
        );
        // The processor's `payment_intent.requires_action` lands while the holder is paused after
        // its call: recorded against the downstream key.
        let recorded = "SELECT count(*) FROM processor_events WHERE type = 'payment_intent.requires_action' \
                        AND downstream_key LIKE '%/charge'";
        let mut seen = 0_i64;
        for _ in 0..200 {
            seen = sqlx::query_scalar(recorded).fetch_one(&sys.pool).await.unwrap();
            if seen > i64::try_from(n).unwrap() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen > i64::try_from(n).unwrap(), "the webhook was not recorded");
        doomed.kill9().await;
        assert!(pending.await.unwrap().is_err(), "the killed server's client got no answer");
        let created_before = sys.sim_stats().await["payment_intents_created"].clone();
        sys.expire_leases().await;
        webhooks_to(&sys, Some(&healthy)).await;
        let (first, id, intent) = waiting(&sys, &healthy.url, &account, &key).await;
        let stats = sys.sim_stats().await;
        assert_eq!(stats["payment_intents_created"], created_before, "adopted, not created again");
        authenticate(&sys, &intent, "complete").await;
        assert_eq!(settled(&sys, &id).await, "succeeded");
        once(&sys, &healthy.url, &account, &key, &first, &id, "succeeded").await;
        webhooks_to(&sys, None).await;
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn webhooks_lost_duplicated_or_reordered_settle_each_waiting_payment_once(
    pool: sqlx::PgPool,
) {
    let sys = System::start(pool).await;
    let account = sys.account("later").await;
    let api = sys.api_with("", &LATER).await;
    sys.faults(json!({"webhook_duplicate_rate": 1.0, "webhook_reorder_rate": 1.0})).await;
    webhooks_to(&sys, Some(&api)).await;
    let mut made = Vec::new();
    for n in 0..4 * scale() {
        let key = format!("storm-{n}");
        let (first, id, intent) = waiting(&sys, &api.url, &account, &key).await;
        // Nothing can be done to it while it waits; the refusals change nothing.
        for action in ["capture", "cancel"] {
            let path = format!("/v1/payments/{id}/{action}");
            let (code, body) = sys
                .post_until_final(
                    &api.url,
                    &account,
                    &path,
                    &format!("{action}-{n}"),
                    &json!({}),
                    5,
                )
                .await
                .unwrap();
            let problem: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!((code, problem["code"].as_str()), (400, Some("payment_requires_action")));
        }
        made.push((key, first, id, intent, n));
    }
    // Half the customers authenticate, a quarter fail; the webhooks of the last quarter are lost
    // for good, and the job asks.
    let lost = 3 * scale();
    for (_, _, _, intent, n) in &made {
        if *n == lost {
            webhooks_to(&sys, None).await;
        }
        let outcome = if *n % 4 == 1 { "fail" } else { "complete" };
        authenticate(&sys, intent, outcome).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(sys.worker_once_with(&LATER).await.success());
    for (key, first, id, _, n) in &made {
        let expected = if *n % 4 == 1 { "failed" } else { "succeeded" };
        assert_eq!(settled(&sys, id).await, expected, "{id}");
        once(&sys, &api.url, &account, key, first, id, expected).await;
    }
}
