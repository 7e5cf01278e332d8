//! The payments API against wiremock as the processor, where every request the processor
//! receives can be counted: one PaymentIntent per payment, one downstream key across every retry.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use payments_tests::{TestApp, assert_problem, json};
use serde_json::{Value, json};
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// A PaymentIntent of 500 cents in Stripe's shape, in `status`, with its charge `ch_wire`.
fn intent(status: &str) -> Value {
    let (capturable, received) = match status {
        "succeeded" => (0, 500),
        "requires_capture" => (500, 0),
        _ => (0, 0),
    };
    json!({"id": "pi_wire", "object": "payment_intent", "amount": 500, "currency": "usd",
           "amount_capturable": capturable, "amount_received": received, "status": status,
           "capture_method": "automatic", "latest_charge": "ch_wire", "next_action": null,
           "last_payment_error": null, "cancellation_reason": null, "metadata": {}})
}

async fn app_against(pool: PgPool, processor: &MockServer) -> TestApp {
    let base = processor.uri();
    TestApp::spawn_with(
        pool.clone(),
        pool,
        &[
            ("PAYMENTS__PROCESSOR__BASE_URL", base.as_str()),
            ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "300"),
            ("PAYMENTS__PROCESSOR__MAX_RETRIES", "1"),
            ("PAYMENTS__PROCESSOR__BACKOFF_BASE_MS", "1"),
            ("PAYMENTS__PROCESSOR__BACKOFF_CAP_MS", "5"),
        ],
    )
    .await
}

/// Where a PaymentIntent is created and confirmed.
const CREATE: &str = "/v1/payment_intents";

fn visa() -> Value {
    json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"})
}

/// The downstream keys of the PaymentIntent creates the processor received, in order.
async fn create_keys(processor: &MockServer) -> Vec<String> {
    processor
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.method == wiremock::http::Method::POST && r.url.path() == CREATE)
        .map(|r| r.headers["idempotency-key"].to_str().unwrap().to_owned())
        .collect()
}

async fn key_state(pool: &PgPool) -> (String, bool, Option<i16>) {
    sqlx::query_as(
        "SELECT recovery_point, owner_token IS NULL, response_status FROM idempotency_keys",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn one_charge_request_per_payment_however_often_the_client_retries(pool: PgPool) {
    let processor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent("succeeded")))
        .mount(&processor)
        .await;
    let app = app_against(pool, &processor).await;
    let (_, key) = app.create_account("shop").await;
    for _ in 0..5 {
        let response = app.post("/v1/payments", &key, Some("k"), &visa()).await;
        assert_eq!(response.status(), 201);
    }
    let keys = create_keys(&processor).await;
    assert_eq!(keys.len(), 1, "retries replay; they never reach the processor");
    assert!(keys[0].starts_with("pay_") && keys[0].ends_with("/charge"), "{}", keys[0]);
    let request = &processor.received_requests().await.unwrap()[0];
    let body = String::from_utf8(request.body.clone()).unwrap();
    assert!(body.contains("metadata%5Bpayment_id%5D=pay_"), "{body}");
    assert!(body.contains("&confirm=true&"), "created and confirmed in one call: {body}");
    assert!(
        !body.contains("k&") && !keys[0].contains("/k"),
        "the client's key never goes downstream"
    );
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_processor_outage_answers_503_and_the_retry_finishes_with_the_same_downstream_key(
    pool: PgPool,
) {
    let processor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(
            ResponseTemplate::new(500)
                .set_body_json(json!({"error": {"type": "api_error", "message": "down"}})),
        )
        .up_to_n_times(2)
        .mount(&processor)
        .await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent("succeeded")))
        .mount(&processor)
        .await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;

    let failed = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_eq!(failed.headers()["retry-after"], "1");
    let problem = assert_problem(failed, 503, "processor_unavailable").await;
    assert!(!problem["detail"].as_str().unwrap().contains("down"), "no upstream body leaks");
    assert_eq!(
        key_state(&pool).await,
        ("payment_created".into(), true, None),
        "resumable, nothing stored"
    );
    let payment: String =
        sqlx::query_scalar("SELECT status FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(payment, "processing");

    let retried = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_eq!(retried.status(), 201);
    assert!(retried.headers().get("idempotent-replayed").is_none());
    assert_eq!(json(retried).await["status"], "succeeded");

    let keys = create_keys(&processor).await;
    assert_eq!(keys.len(), 3, "two failed tries (one retry inside the client), then the success");
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "the same downstream key every time: {keys:?}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_processor_timeout_leaves_the_key_resumable_and_the_retry_does_not_charge_twice(
    pool: PgPool,
) {
    let processor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(intent("succeeded"))
                .set_delay(Duration::from_secs(2)),
        )
        .up_to_n_times(2)
        .mount(&processor)
        .await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent("succeeded")))
        .mount(&processor)
        .await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;

    let timed_out = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_problem(timed_out, 503, "processor_unavailable").await;
    assert_eq!(key_state(&pool).await.0, "payment_created");

    let finished = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_eq!(finished.status(), 201);
    let keys = create_keys(&processor).await;
    assert!(
        keys.windows(2).all(|w| w[0] == w[1]),
        "one downstream key, so the processor acts once: {keys:?}"
    );
    assert_eq!(key_state(&pool).await, ("finished".into(), true, Some(201)));
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_processor_refusal_after_execution_began_is_stored(pool: PgPool) {
    let processor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({"error": {
            "type": "invalid_request_error", "code": "amount_too_small", "param": "amount",
            "message": "Amount must be at least 50 cents."}})))
        .mount(&processor)
        .await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 10, "currency": "usd", "payment_method": "pm_card_visa"});
    let refused = app.post("/v1/payments", &key, Some("k"), &body).await;
    assert_eq!(assert_problem(refused, 400, "invalid_request").await["param"], "amount");
    let replay = app.post("/v1/payments", &key, Some("k"), &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(create_keys(&processor).await.len(), 1);
    let status: String =
        sqlx::query_scalar("SELECT status FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "failed");
}

/// Stripe answers `200` for a refund that has not moved the money (yet): `pending`,
/// `requires_action`, `failed`, `canceled`. None of them may be recorded as a success.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_refund_the_processor_has_not_completed_is_referred_to_a_person_not_recorded(
    pool: PgPool,
) {
    let processor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent("succeeded")))
        .mount(&processor)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/refunds"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "re_wire", "object": "refund", "charge": "ch_wire",
            "payment_intent": "pi_wire", "amount": 200,
            "currency": "usd", "status": "pending", "metadata": {}})))
        .mount(&processor)
        .await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;
    let paid = json(app.post("/v1/payments", &key, Some("pay"), &visa()).await).await;
    let path = format!("/v1/payments/{}/refunds", paid["id"].as_str().unwrap());
    let refund = app.post(&path, &key, Some("refund"), &json!({"amount": 200})).await;
    assert_problem(refund, 422, "operation_needs_review").await;
    // The retry does not call the processor again, and says the same.
    let again = app.post(&path, &key, Some("refund"), &json!({"amount": 200})).await;
    assert_problem(again, 422, "operation_needs_review").await;
    let received = processor.received_requests().await.unwrap();
    let refund_calls: Vec<_> = received.iter().filter(|r| r.url.path() == "/v1/refunds").collect();
    assert_eq!(refund_calls.len(), 1);
    let form = String::from_utf8(refund_calls[0].body.clone()).unwrap();
    assert!(form.starts_with("payment_intent=pi_wire&"), "refunds name the PaymentIntent: {form}");
    let (status, reserved): (String, i64) = sqlx::query_as(
        "SELECT r.status, p.amount_refunded FROM refunds r JOIN payments p ON p.id = r.payment_id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_ne!(status, "succeeded", "a pending refund is not a succeeded one");
    assert_eq!(reserved, 200, "the amount stays reserved while a person looks");
    let flagged: bool = sqlx::query_scalar(
        "SELECT needs_human_at IS NOT NULL FROM idempotency_keys WHERE idempotency_key = 'refund'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(flagged);
}

/// The processor answers the PaymentIntent `processing`: not a decline. The key waits at its
/// call, never stores a refusal, and finishes with what the PaymentIntent came to.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_intent_answered_processing_is_never_stored_as_a_decline(pool: PgPool) {
    let processor = MockServer::start().await;
    let processing = intent("processing");
    // Every create under the key answers the same, as Stripe replays a key's first answer.
    let answer = |body: &Value| ResponseTemplate::new(200).set_body_json(body);
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(answer(&processing))
        .mount(&processor)
        .await;
    // Looked up by its id: undecided the first time, then captured.
    let intent_path = "/v1/payment_intents/pi_wire";
    Mock::given(method("GET"))
        .and(path(intent_path))
        .respond_with(answer(&processing))
        .up_to_n_times(1)
        .mount(&processor)
        .await;
    Mock::given(method("GET"))
        .and(path(intent_path))
        .respond_with(answer(&intent("succeeded")))
        .mount(&processor)
        .await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;

    let waiting = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_eq!(waiting.headers()["retry-after"], "30");
    assert_problem(waiting, 503, "processor_unavailable").await;
    let status: String =
        sqlx::query_scalar("SELECT status::text FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "processing", "an undecided PaymentIntent is not a decline");
    let (point, released, stored) = key_state(&pool).await;
    assert_eq!((point.as_str(), released, stored), ("payment_created", true, None));

    let finished = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_eq!(finished.status(), 201);
    let payment = json(finished).await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["processor_payment_intent_id"], "pi_wire");
    let lookups = processor.received_requests().await.unwrap();
    let lookups = lookups.iter().filter(|r| r.url.path() == intent_path).count();
    assert_eq!(lookups, 2, "looked up by its id after each undecided answer");
    let keys = create_keys(&processor).await;
    assert_eq!(keys.len(), 2, "the retry called under the same key");
    assert_eq!(keys[0], keys[1]);
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE type = 'payment.failed'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failed, 0);
}

/// The processor's search for a payment's PaymentIntents: the payment's PaymentIntent,
/// `processing` for the first `undecided` searches and captured after.
struct SearchFindsPending {
    undecided: usize,
    searches: AtomicUsize,
}

impl Respond for SearchFindsPending {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let query: String = request.url.query_pairs().map(|(_, v)| v.into_owned()).collect();
        let start = query.find("pay_").expect("a search by payment id");
        let payment_id: String =
            query[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let undecided = self.searches.fetch_add(1, Ordering::SeqCst) < self.undecided;
        let mut found = intent(if undecided { "processing" } else { "succeeded" });
        found["metadata"] = json!({"payment_id": payment_id});
        ResponseTemplate::new(200)
            .set_body_json(json!({"object": "search_result", "data": [found], "has_more": false}))
    }
}

/// The create's answer cannot tell (`idempotency_error`), and the search finds the payment's
/// PaymentIntent `processing`: one exists, so the key neither stores a decline nor moves to its
/// next generation; it waits, and the retry adopts the PaymentIntent once it succeeded.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_processing_intent_the_search_finds_is_waited_for_not_declined(pool: PgPool) {
    let processor = MockServer::start().await;
    let reused = json!({"error": {"type": "idempotency_error", "message": "Keys for idempotent \
        requests can only be used with the same parameters they were first used with."}});
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(ResponseTemplate::new(400).set_body_json(reused))
        .mount(&processor)
        .await;
    let search = SearchFindsPending { undecided: 1, searches: AtomicUsize::new(0) };
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents/search"))
        .respond_with(search)
        .mount(&processor)
        .await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;

    let waiting = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_eq!(waiting.headers()["retry-after"], "30");
    assert_problem(waiting, 503, "processor_unavailable").await;
    let (point, released, stored) = key_state(&pool).await;
    assert_eq!((point.as_str(), released, stored), ("payment_created", true, None));

    let finished = app.post("/v1/payments", &key, Some("k"), &visa()).await;
    assert_eq!(finished.status(), 201);
    let payment = json(finished).await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["processor_payment_intent_id"], "pi_wire");
    let keys = create_keys(&processor).await;
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "never a next generation while a PaymentIntent exists");
}

/// The create call takes a while, and when it returns the payment's row is locked (a stuck
/// transaction, say), so the last phase waits past the lease. A retry meanwhile must not take the
/// key over: the last phase holds its key from its first statement, so the charged client gets
/// its `201` (not a `409` for a lease lost while it waited), and the retry replays it.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_last_phase_that_waits_past_its_lease_is_not_taken_over(pool: PgPool) {
    let processor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(CREATE))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(intent("succeeded"))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&processor)
        .await;
    let base = processor.uri();
    let settings = [
        ("PAYMENTS__PROCESSOR__BASE_URL", base.as_str()),
        ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "5000"),
        ("PAYMENTS__PROCESSOR__MAX_RETRIES", "0"),
    ];
    let app = TestApp::spawn_with(pool.clone(), pool.clone(), &settings).await;
    let (_, key) = app.create_account("shop").await;
    let send = || {
        let request = app.http.post(app.url("/v1/payments")).bearer_auth(&key);
        request.header("idempotency-key", "k").json(&visa()).send()
    };
    let first = tokio::spawn(send());

    // While the call runs: the payment's row is locked, and the key's lease runs out.
    let created = || async {
        let payments: i64 =
            sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(&pool).await.unwrap();
        payments == 1
    };
    payments_testkit::eventually("the first phase", Duration::from_secs(5), created).await;
    let mut stuck = pool.begin().await.unwrap();
    sqlx::query("SELECT FROM payments FOR UPDATE").execute(&mut *stuck).await.unwrap();
    sqlx::query("UPDATE idempotency_keys SET locked_until = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    // The call returns; the last phase's batch and then its statement alone give up on the
    // lock, and its general phase holds the key and waits for the lock.
    let tries = idem::batch::DEADLINE + idem::ONE_STATEMENT_TIMEOUT;
    tokio::time::sleep(Duration::from_millis(2200) + tries).await;
    let retry = tokio::spawn(send());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!retry.is_finished(), "the retry waits for the holder's phase");
    stuck.commit().await.unwrap();

    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 201, "the charged client gets its answer");
    let retry = retry.await.unwrap().unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(create_keys(&processor).await.len(), 1, "the retry did not call again");
}
