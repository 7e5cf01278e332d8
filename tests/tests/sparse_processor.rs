//! The payments API against a Stripe-compatible server that answers PaymentIntents and refunds in
//! the sparsest shape such a server may send (no `amount_received`, no `amount_capturable`, no
//! `latest_charge`, no metadata echo; refunds with only `id`, `amount` and `status`) and that
//! ignores `Idempotency-Key` altogether: whatever it is sent twice, it does twice. Issue #38's
//! done-when: a create, a capture, a cancel and a refund each finish with one call each, and
//! nothing is sent again after a 2xx.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use payments_tests::{TestApp, json};
use serde_json::{Value, json};
use sqlx::PgPool;
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// A Stripe-compatible server with a memory and no idempotency: every POST acts, and each answer
/// carries only what the wire format cannot do without.
#[derive(Clone, Default)]
struct SparseServer {
    /// Each PaymentIntent it made: its amount and currency.
    intents: Arc<Mutex<HashMap<String, (i64, String)>>>,
    /// How many refunds it made, for their ids.
    refunds: Arc<Mutex<u32>>,
}

/// A request's form, by field name.
fn form(request: &Request) -> BTreeMap<String, String> {
    serde_urlencoded::from_bytes(&request.body).unwrap_or_else(|err| {
        panic!("the provider sent a body that is not a form ({err}): {:?}", request.body)
    })
}

/// The intent id in a path `/v1/payment_intents/{id}/{action}`.
fn intent_in(request: &Request) -> String {
    let segments: Vec<&str> = request.url.path().split('/').collect();
    let id = segments.get(3).expect("a path with the PaymentIntent's id");
    (*id).to_owned()
}

fn sparse_intent(id: &str, amount: i64, currency: &str, status: &str) -> Value {
    json!({"id": id, "object": "payment_intent", "amount": amount, "currency": currency,
           "status": status})
}

impl Respond for SparseServer {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let fields = form(request);
        let path = request.url.path();
        let mut intents = self.intents.lock().unwrap();
        let body = if path == "/v1/payment_intents" {
            // One intent per call, named after our payment: a second create for the same
            // payment would make a second intent, as such a server would.
            let payment = &fields["metadata[payment_id]"];
            let id = format!("pi_{}_{}", payment.trim_start_matches("pay_"), intents.len());
            let amount: i64 = fields["amount"].parse().unwrap();
            let currency = fields["currency"].clone();
            let status = match fields["capture_method"].as_str() {
                "manual" => "requires_capture",
                _ => "succeeded",
            };
            intents.insert(id.clone(), (amount, currency.clone()));
            sparse_intent(&id, amount, &currency, status)
        } else if path == "/v1/refunds" {
            let mut made = self.refunds.lock().unwrap();
            *made += 1;
            let amount: i64 = fields["amount"].parse().unwrap();
            json!({"id": format!("re_sparse_{made}"), "amount": amount, "status": "succeeded"})
        } else {
            let id = intent_in(request);
            let (amount, currency) = intents[&id].clone();
            let status = if path.ends_with("/capture") { "succeeded" } else { "canceled" };
            sparse_intent(&id, amount, &currency, status)
        };
        ResponseTemplate::new(200).set_body_json(body)
    }
}

/// A wiremock server that is [`SparseServer`] for exactly `creates` creates, `captures`
/// captures, `cancels` cancels and `refunds` refunds (checked when it is verified), and answers
/// 404 to anything else.
async fn sparse_processor(creates: u64, captures: u64, cancels: u64, refunds: u64) -> MockServer {
    let processor = MockServer::start().await;
    let server = SparseServer::default();
    for (route, times) in [
        (r"^/v1/payment_intents$", creates),
        (r"^/v1/payment_intents/[^/]+/capture$", captures),
        (r"^/v1/payment_intents/[^/]+/cancel$", cancels),
        (r"^/v1/refunds$", refunds),
    ] {
        Mock::given(method("POST"))
            .and(path_regex(route))
            .respond_with(server.clone())
            .expect(times)
            .mount(&processor)
            .await;
    }
    processor
}

async fn app_against(pool: PgPool, processor: &MockServer) -> TestApp {
    let base = processor.uri();
    TestApp::spawn_with(
        pool.clone(),
        pool,
        &[
            ("PAYMENTS__PROCESSOR__BASE_URL", base.as_str()),
            ("PAYMENTS__PROCESSOR__REQUEST_TIMEOUT_MS", "2000"),
            ("PAYMENTS__PROCESSOR__MAX_RETRIES", "2"),
            ("PAYMENTS__PROCESSOR__BACKOFF_BASE_MS", "1"),
            ("PAYMENTS__PROCESSOR__BACKOFF_CAP_MS", "5"),
        ],
    )
    .await
}

/// Every request the processor received, as `METHOD path`, in order.
async fn received(processor: &MockServer) -> Vec<String> {
    let requests = processor.received_requests().await.unwrap();
    requests.iter().map(|r| format!("{} {}", r.method, r.url.path())).collect()
}

/// The `Idempotency-Key` of every request the processor received, in order.
async fn downstream_keys(processor: &MockServer) -> Vec<String> {
    let requests = processor.received_requests().await.unwrap();
    requests
        .iter()
        .map(|r| r.headers.get("idempotency-key").map_or("", |v| v.to_str().unwrap()).to_owned())
        .collect()
}

/// A POST that must answer `status`; its body.
async fn post(
    app: &TestApp,
    key: &str,
    path: &str,
    idem: &str,
    body: &Value,
    status: u16,
) -> Value {
    let response = app.post(path, key, Some(idem), body).await;
    assert_eq!(response.status(), status, "POST {path}: {:?}", response.text().await);
    json(response).await
}

/// What the database holds for a payment: status, amounts, the PaymentIntent, the charge, the
/// cancellation reason.
type StoredPayment = (String, i64, i64, Option<String>, Option<String>, Option<String>);

async fn stored_payment(pool: &PgPool, id: &str) -> StoredPayment {
    sqlx::query_as(
        "SELECT status::text, amount_captured::bigint, amount_refunded::bigint, \
                processor_payment_intent_id, processor_charge_id, cancellation_reason::text \
         FROM payments WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn visa(amount: i64, capture_method: &str) -> Value {
    json!({"amount": amount, "currency": "usd", "payment_method": "pm_card_visa",
           "capture_method": capture_method})
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_sparse_server_that_ignores_keys_sees_one_call_for_each_create_capture_cancel_and_refund(
    pool: PgPool,
) {
    let processor = sparse_processor(3, 1, 1, 1).await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;

    let paid = post(&app, &key, "/v1/payments", "p1", &visa(500, "automatic"), 201).await;
    assert_eq!(
        (paid["status"].as_str(), paid["amount_captured"].as_i64()),
        (Some("succeeded"), Some(500))
    );
    let paid_id = paid["id"].as_str().unwrap().to_owned();

    let held = post(&app, &key, "/v1/payments", "p2", &visa(1000, "manual"), 201).await;
    assert_eq!(
        (held["status"].as_str(), held["amount_captured"].as_i64()),
        (Some("requires_capture"), Some(0))
    );
    let held_id = held["id"].as_str().unwrap().to_owned();
    let captured =
        post(&app, &key, &format!("/v1/payments/{held_id}/capture"), "c1", &json!({}), 200).await;
    assert_eq!(
        (captured["status"].as_str(), captured["amount_captured"].as_i64()),
        (Some("succeeded"), Some(1000))
    );

    let released = post(&app, &key, "/v1/payments", "p3", &visa(700, "manual"), 201).await;
    assert_eq!(released["status"], "requires_capture");
    let released_id = released["id"].as_str().unwrap().to_owned();
    let reason = json!({"cancellation_reason": "requested_by_customer"});
    let canceled =
        post(&app, &key, &format!("/v1/payments/{released_id}/cancel"), "x1", &reason, 200).await;
    assert_eq!(
        (canceled["status"].as_str(), canceled["cancellation_reason"].as_str()),
        (Some("canceled"), Some("requested_by_customer"))
    );

    let refund_path = format!("/v1/payments/{paid_id}/refunds");
    let refund = post(&app, &key, &refund_path, "r1", &json!({"amount": 200}), 201).await;
    assert_eq!(
        (refund["status"].as_str(), refund["amount"].as_i64()),
        (Some("succeeded"), Some(200))
    );
    assert_eq!(refund["processor_refund_id"], "re_sparse_1");

    // The clients' retries replay their answers: none reaches the processor.
    for (path, idem, body) in [
        ("/v1/payments".to_owned(), "p1", visa(500, "automatic")),
        (format!("/v1/payments/{held_id}/capture"), "c1", json!({})),
        (format!("/v1/payments/{released_id}/cancel"), "x1", reason.clone()),
        (refund_path.clone(), "r1", json!({"amount": 200})),
    ] {
        let replay = app.post(&path, &key, Some(idem), &body).await;
        assert_eq!(replay.headers()["idempotent-replayed"], "true", "{path}");
    }

    let calls = received(&processor).await;
    let capture = format!("POST /v1/payment_intents/{}/capture", intent_of(&pool, &held_id).await);
    let cancel =
        format!("POST /v1/payment_intents/{}/cancel", intent_of(&pool, &released_id).await);
    assert_eq!(
        calls,
        [
            "POST /v1/payment_intents",
            "POST /v1/payment_intents",
            capture.as_str(),
            "POST /v1/payment_intents",
            cancel.as_str(),
            "POST /v1/refunds",
        ],
        "one call per operation, no lookups, nothing sent again"
    );
    let keys = downstream_keys(&processor).await;
    let distinct: std::collections::BTreeSet<&String> = keys.iter().collect();
    assert!(keys.iter().all(|k| !k.is_empty()), "every call still carries a key: {keys:?}");
    assert_eq!(distinct.len(), keys.len(), "each call its own key: {keys:?}");
    processor.verify().await;

    let intent = |id: &str| Some(id.to_owned());
    let paid_intent = intent_of(&pool, &paid_id).await;
    assert_eq!(
        stored_payment(&pool, &paid_id).await,
        ("succeeded".into(), 500, 200, intent(&paid_intent), None, None)
    );
    let held_intent = intent_of(&pool, &held_id).await;
    assert_eq!(
        stored_payment(&pool, &held_id).await,
        ("succeeded".into(), 1000, 0, intent(&held_intent), None, None)
    );
    let released_intent = intent_of(&pool, &released_id).await;
    assert_eq!(
        stored_payment(&pool, &released_id).await,
        (
            "canceled".into(),
            0,
            0,
            intent(&released_intent),
            None,
            Some("requested_by_customer".into())
        )
    );
    let refunds: Vec<(String, Option<String>, i64)> =
        sqlx::query_as("SELECT status::text, processor_refund_id, amount::bigint FROM refunds")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(refunds, [("succeeded".to_owned(), Some("re_sparse_1".to_owned()), 200)]);
    let unfinished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished' OR response_status IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(unfinished, 0, "every key finished with its stored answer");
}

/// The PaymentIntent the database records for a payment.
async fn intent_of(pool: &PgPool, payment_id: &str) -> String {
    let id: Option<String> =
        sqlx::query_scalar("SELECT processor_payment_intent_id FROM payments WHERE id = $1")
            .bind(payment_id)
            .fetch_one(pool)
            .await
            .unwrap();
    id.unwrap_or_else(|| panic!("{payment_id} has no PaymentIntent"))
}

/// A partial capture on a server that leaves `amount_received` out: the processor took what it
/// was asked (`amount_to_capture`), so that is what the payment records (read as all of
/// `amount`, it would record 1000 after a capture of 600, and then let 1000 be refunded).
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_partial_capture_on_a_sparse_server_records_the_amount_asked_for(pool: PgPool) {
    let processor = sparse_processor(1, 1, 0, 0).await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;
    let held = post(&app, &key, "/v1/payments", "p", &visa(1000, "manual"), 201).await;
    let held_id = held["id"].as_str().unwrap().to_owned();
    let capture_path = format!("/v1/payments/{held_id}/capture");
    let partial = json!({"amount_to_capture": 600});
    let captured = post(&app, &key, &capture_path, "c", &partial, 200).await;
    assert_eq!(
        (captured["status"].as_str(), captured["amount_captured"].as_i64()),
        (Some("succeeded"), Some(600)),
        "the answer shows what was captured"
    );
    let sent = processor.received_requests().await.unwrap();
    assert_eq!(form(&sent[1]).get("amount_to_capture").map(String::as_str), Some("600"));
    processor.verify().await;
    let (status, amount_captured, ..) = stored_payment(&pool, &held_id).await;
    assert_eq!((status.as_str(), amount_captured), ("succeeded", 600));
}

/// A create whose 2xx answer cannot be read is looked up, never sent again; a server whose search
/// answers PaymentIntents that do not name the payment (it leaves `metadata` out) cannot tell the
/// payment's from nothing, so the key is referred to a person: read as "nothing found", it would
/// move to the next generation of its key and charge the card a second time.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_search_whose_hits_do_not_name_the_payment_is_for_a_person_not_nothing_found(
    pool: PgPool,
) {
    let processor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path_regex(r"^/v1/payment_intents$"))
        .respond_with(ResponseTemplate::new(200).set_body_string("{\"id\": \"pi_garbled"))
        .expect(1)
        .mount(&processor)
        .await;
    let hit = sparse_intent("pi_garbled", 500, "usd", "succeeded");
    let page = json!({"object": "search_result", "data": [hit], "has_more": false});
    Mock::given(method("GET"))
        .and(path_regex(r"^/v1/payment_intents/search$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(page))
        .mount(&processor)
        .await;
    let app = app_against(pool.clone(), &processor).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    let created = app.post("/v1/payments", &key, Some("k1"), &body).await;
    assert_eq!(created.status(), 422, "{:?}", created.text().await);
    let again = app.post("/v1/payments", &key, Some("k1"), &body).await;
    assert_eq!(again.status(), 422);
    let creates = received(&processor).await;
    let creates = creates.iter().filter(|r| *r == "POST /v1/payment_intents").count();
    assert_eq!(creates, 1, "never sent again, under any generation");
    let status: String =
        sqlx::query_scalar("SELECT status FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "processing");
}
