//! The fast path and the reference road of a new payment write the same: the same payment row, the
//! same audit records, events, webhook deliveries and receipt jobs, and the same stored answer,
//! byte for byte once the ids each road made are named alike. One server takes the fast path (the
//! claim in the first phase, the last phase as one statement or a row of a batch), the other the
//! reference road (`idempotency.fast_path = false`: a fenced transaction per phase).

use payments_tests::TestApp;
use serde_json::{Value, json};
use sqlx::PgPool;

/// The payments both roads make: captured at once, authorized only, with a receipt, with a
/// description and metadata, and declined.
fn bodies() -> Vec<Value> {
    let card = |extra: Value| {
        let mut body = json!({"amount": 1250, "currency": "usd", "payment_method": "pm_card_visa"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    vec![
        card(json!({})),
        card(json!({"capture_method": "manual"})),
        card(json!({"receipt_email": "buyer@example.com"})),
        card(json!({"description": "Order 1", "metadata": {"order": "1"}})),
        card(json!({"payment_method": "pm_card_chargeDeclined"})),
    ]
}

/// `value` with the ids one road made (`ids`, each with the name it gets) named alike, and the
/// second a thing was made at dropped: what must be equal between the two roads.
fn alike(value: &Value, ids: &[(String, &str)]) -> Value {
    let mut text = value.to_string();
    for (id, name) in ids {
        text = text.replace(id.as_str(), name);
    }
    let mut value: Value = serde_json::from_str(&text).unwrap();
    drop_created(&mut value);
    value
}

fn drop_created(value: &mut Value) {
    match value {
        Value::Object(members) => {
            members.remove("created");
            members.values_mut().for_each(drop_created);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_created),
        _ => {}
    }
}

/// A payment's id, its charge and PaymentIntent at the processor, and its key's request id.
type Ids = (String, Option<String>, Option<String>, String);

/// Everything a payment's creation wrote through `app`, with its ids (and the server's own
/// address, in problem links) named alike.
async fn written(app: &TestApp, key: &str) -> Value {
    let pool = &app.pool;
    let (payment_id, charge_id, intent_id, request_id): Ids = sqlx::query_as(
        "SELECT p.id, p.processor_charge_id, p.processor_payment_intent_id, k.request_id \
           FROM payments p \
           JOIN idempotency_keys k ON k.id = p.idempotency_key_id \
          WHERE k.idempotency_key = $1",
    )
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap();
    let mut record: Value = sqlx::query_scalar(
        "SELECT jsonb_build_object( \
           'payment', (SELECT to_jsonb(p) - 'id' - 'seq' - 'idempotency_key_id' \
                          - 'created_at' - 'updated_at' FROM payments p WHERE id = $1), \
           'key', (SELECT jsonb_build_object('point', recovery_point, 'status', response_status, \
                     'headers', response_headers, 'body', convert_from(response_body, 'UTF8'), \
                     'operation', operation, 'params', request_params) \
                     FROM idempotency_keys WHERE idempotency_key = $2), \
           'audit', (SELECT jsonb_agg(jsonb_build_object('action', action, 'detail', detail) \
                       ORDER BY id) FROM audit_events WHERE object_id = $1), \
           'events', (SELECT jsonb_agg(jsonb_build_object('type', type, 'object', object) \
                        ORDER BY seq) FROM events WHERE object ->> 'id' = $1), \
           'deliveries', (SELECT count(*) FROM jobs j JOIN events e \
                            ON j.dedupe_key LIKE e.id || ':%' \
                         WHERE j.kind = 'webhook' AND e.object ->> 'id' = $1), \
           'receipts', (SELECT count(*) FROM jobs WHERE kind = 'receipt' AND dedupe_key = $1))",
    )
    .bind(&payment_id)
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap();
    // The stored body's bytes, but for the second it was made at.
    let body = record["key"]["body"].as_str().unwrap().to_owned();
    let created = body.find("\"created\":").map(|at| at + "\"created\":".len());
    if let Some(at) = created {
        let end = at + body[at..].find(|c: char| !c.is_ascii_digit()).unwrap();
        record["key"]["body"] = json!(format!("{}0{}", &body[..at], &body[end..]));
    }
    // An ETag is a digest of the body with its ids: equal bodies once named alike are enough.
    for header in record["key"]["headers"].as_array_mut().unwrap() {
        if header[0] == "etag" {
            header[1] = json!("\"etag\"");
        }
    }
    let mut ids = vec![(payment_id, "pay_X"), (request_id, "req_X"), (app.address.clone(), "X")];
    ids.extend(charge_id.map(|id| (id, "ch_X")));
    ids.extend(intent_id.map(|id| (id, "pi_X")));
    // The stored body is text: its ids are named alike inside it too.
    alike(&record, &ids)
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_fast_path_and_the_reference_road_write_the_same(pool: PgPool) {
    let sim = payments_tests::start_sim(processor_sim::FaultConfig::default()).await;
    let processor = ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str());
    let fast = TestApp::spawn_with(pool.clone(), pool.clone(), &[processor]).await;
    let reference_road = ("PAYMENTS__IDEMPOTENCY__FAST_PATH", "false");
    let reference = TestApp::spawn_with(pool.clone(), pool, &[processor, reference_road]).await;
    let (_, key) = fast.create_account("shop").await;
    let endpoint = json!({"url": "https://hooks.example.com/x", "enabled_events": ["*"]});
    assert_eq!(fast.post("/v1/webhook_endpoints", &key, None, &endpoint).await.status(), 201);

    for (n, body) in bodies().iter().enumerate() {
        let (fast_key, reference_key) = (format!("fast-{n}"), format!("reference-{n}"));
        let by_fast = fast.post("/v1/payments", &key, Some(&fast_key), body).await;
        let by_reference = reference.post("/v1/payments", &key, Some(&reference_key), body).await;
        assert_eq!(by_fast.status(), by_reference.status(), "{body}");
        let (fast_written, reference_written) =
            (written(&fast, &fast_key).await, written(&reference, &reference_key).await);
        assert_eq!(fast_written, reference_written, "{body}");
        assert!(fast_written["audit"].as_array().is_some_and(|audit| audit.len() >= 2), "{body}");
    }
    let finished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished'",
    )
    .fetch_one(&fast.pool)
    .await
    .unwrap();
    assert_eq!(finished, 2 * bodies().len() as i64, "both roads finished every key");
}
