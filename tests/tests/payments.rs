//! The payments API end to end: the real server, a fresh database per test, and the stand-in
//! processor (or wiremock, where a test must see every request the processor receives).

use std::sync::Arc;

use payments_tests::{TestApp, assert_problem, json, spawn_with_sim};
use serde_json::{Value, json};
use sqlx::PgPool;

fn visa(amount: i64) -> Value {
    json!({"amount": amount, "currency": "usd", "payment_method": "pm_card_visa"})
}

async fn create(app: &TestApp, key: &str, idem: &str, body: &Value) -> Value {
    let response = app.post("/v1/payments", key, Some(idem), body).await;
    assert_eq!(response.status(), 201, "{:?}", response.text().await);
    json(response).await
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}")).fetch_one(pool).await.unwrap()
}

async fn sim_stats(sim: &str) -> Value {
    reqwest::get(format!("{sim}/_sim/stats")).await.unwrap().json().await.unwrap()
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_payment_is_created_and_a_retry_replays_it_byte_for_byte(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa",
                      "description": "Two books", "metadata": {"order": "42"}});
    let first = app.post("/v1/payments", &key, Some("order-42"), &body).await;
    assert_eq!(first.status(), 201);
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    let first_body = first.bytes().await.unwrap();
    let payment: Value = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(location, format!("/v1/payments/{}", payment["id"].as_str().unwrap()));
    assert!(payment["id"].as_str().unwrap().starts_with("pay_"));
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["amount_captured"], 500);
    assert_eq!(payment["metadata"], json!({"order": "42"}));
    assert!(payment["processor_charge_id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(payment["livemode"], false);

    let replay = app.post("/v1/payments", &key, Some("order-42"), &body).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"].to_str().unwrap(), location);
    assert_eq!(replay.headers()["etag"].to_str().unwrap(), etag);
    assert_eq!(replay.bytes().await.unwrap(), first_body);

    let read = app.get(&location, &key).await;
    assert_eq!(read.status(), 200);
    assert_eq!(read.headers()["etag"].to_str().unwrap(), etag);
    assert_eq!(read.bytes().await.unwrap(), first_body);
    assert_eq!(sim_stats(&sim).await["charges_created"], 1);
    assert_eq!(count(&pool, "payments").await, 1);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_declined_card_stores_a_402_and_a_failed_payment(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd",
                      "payment_method": "pm_card_chargeDeclinedInsufficientFunds"});
    let first = app.post("/v1/payments", &key, Some("k"), &body).await;
    let problem = assert_problem(first, 402, "card_declined").await;
    assert_eq!(problem["decline_code"], "insufficient_funds");
    let payment_id = problem["payment_id"].as_str().unwrap().to_owned();

    let payment = json(app.get(&format!("/v1/payments/{payment_id}"), &key).await).await;
    assert_eq!(payment["status"], "failed");
    assert_eq!(payment["failure_code"], "insufficient_funds");

    let replay = app.post("/v1/payments", &key, Some("k"), &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed = assert_problem(replay, 402, "card_declined").await;
    assert_eq!(replayed, problem, "the replay keeps the first request's id and every byte");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn every_declining_token_is_a_402_with_its_decline_code(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    for (token, code) in [
        ("pm_card_chargeDeclined", "generic_decline"),
        ("pm_card_chargeDeclinedExpiredCard", "expired_card"),
    ] {
        let body = json!({"amount": 100, "currency": "eur", "payment_method": token});
        let response = app.post("/v1/payments", &key, Some(token), &body).await;
        assert_eq!(assert_problem(response, 402, "card_declined").await["decline_code"], code);
    }
    let mastercard =
        json!({"amount": 100, "currency": "jpy", "payment_method": "pm_card_mastercard"});
    assert_eq!(create(&app, &key, "mc", &mastercard).await["status"], "succeeded");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn invalid_input_names_the_parameter_and_stores_nothing(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let cases = [
        (json!({"currency": "usd", "payment_method": "pm_card_visa"}), "amount"),
        (json!({"amount": 0, "currency": "usd", "payment_method": "pm_card_visa"}), "amount"),
        (
            json!({"amount": 100000000, "currency": "usd", "payment_method": "pm_card_visa"}),
            "amount",
        ),
        (json!({"amount": 5.5, "currency": "usd", "payment_method": "pm_card_visa"}), "amount"),
        (json!({"amount": 500, "currency": "xyz", "payment_method": "pm_card_visa"}), "currency"),
        (
            json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_nope"}),
            "payment_method",
        ),
        (
            json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa", "capture_method": "later"}),
            "capture_method",
        ),
        (
            json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa", "metadata": {"k": 1}}),
            "metadata.k",
        ),
        (
            json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa", "receipt_email": "nope"}),
            "receipt_email",
        ),
        (
            json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa", "colour": "red"}),
            "colour",
        ),
    ];
    for (body, param) in cases {
        let response = app.post("/v1/payments", &key, Some("same-key"), &body).await;
        let problem = assert_problem(response, 400, "invalid_request").await;
        assert_eq!(problem["param"], param, "{body}");
    }
    assert_eq!(count(&pool, "idempotency_keys").await, 0, "validation failures store nothing");
    // The same key with a corrected body succeeds.
    create(&app, &key, "same-key", &visa(500)).await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn checks_run_in_the_documented_order(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    // No credentials beat everything else.
    let anonymous = app
        .send(app.http.post(app.url("/v1/payments")).header("idempotency-key", "bad key").body("x"))
        .await;
    assert_problem(anonymous, 401, "authentication_required").await;
    // Then the key's syntax, before the media type.
    let bad_key = app
        .send(
            app.http
                .post(app.url("/v1/payments"))
                .bearer_auth(&key)
                .header("idempotency-key", "bad key")
                .body("x"),
        )
        .await;
    assert_problem(bad_key, 400, "idempotency_key_invalid").await;
    let no_key = app.post("/v1/payments", &key, None, &visa(500)).await;
    assert_problem(no_key, 400, "idempotency_key_missing").await;
    // Then the media type, before the body.
    let text = app
        .send(
            app.http
                .post(app.url("/v1/payments"))
                .bearer_auth(&key)
                .header("idempotency-key", "k")
                .header("content-type", "text/plain")
                .body("amount=5"),
        )
        .await;
    assert_problem(text, 415, "unsupported_media_type").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_same_key_with_another_body_is_unprocessable(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    create(&app, &key, "k", &visa(500)).await;
    let other = app.post("/v1/payments", &key, Some("k"), &visa(501)).await;
    let problem = assert_problem(other, 422, "idempotency_key_reused").await;
    assert!(problem["detail"].as_str().unwrap().contains("POST /v1/payments"));
    let capture = app.post("/v1/payments/pay_x/capture", &key, Some("k"), &json!({})).await;
    assert_problem(capture, 404, "resource_missing").await;
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_manual_payment_is_captured_once(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa", "capture_method": "manual"});
    let payment = create(&app, &key, "p1", &body).await;
    assert_eq!(
        (payment["status"].as_str(), payment["amount_captured"].as_i64()),
        (Some("requires_capture"), Some(0))
    );
    let id = payment["id"].as_str().unwrap();
    let path = format!("/v1/payments/{id}/capture");

    let too_much = app.post(&path, &key, Some("c0"), &json!({"amount_to_capture": 1001})).await;
    assert_eq!(
        assert_problem(too_much, 400, "amount_too_large").await["param"],
        "amount_to_capture"
    );

    let captured = app.post(&path, &key, Some("c1"), &json!({"amount_to_capture": 600})).await;
    assert_eq!(captured.status(), 200);
    assert!(captured.headers().get("etag").is_some());
    let captured = json(captured).await;
    assert_eq!(
        (captured["status"].as_str(), captured["amount_captured"].as_i64()),
        (Some("succeeded"), Some(600))
    );

    let replay = app.post(&path, &key, Some("c1"), &json!({"amount_to_capture": 600})).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(replay).await, captured);

    let again = app.post(&path, &key, Some("c2"), &json!({})).await;
    assert_problem(again, 400, "payment_unexpected_state").await;
    let again_replayed = app.post(&path, &key, Some("c2"), &json!({})).await;
    assert_eq!(
        again_replayed.headers()["idempotent-replayed"],
        "true",
        "domain refusals are stored"
    );
    assert_eq!(sim_stats(&sim).await["captures"], 1);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_cancel_releases_the_authorization_and_only_from_requires_capture(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let manual = json!({"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa", "capture_method": "manual"});
    let id = create(&app, &key, "p1", &manual).await["id"].as_str().unwrap().to_owned();
    let canceled = app
        .post(
            &format!("/v1/payments/{id}/cancel"),
            &key,
            Some("x1"),
            &json!({"cancellation_reason": "requested_by_customer"}),
        )
        .await;
    assert_eq!(canceled.status(), 200);
    let canceled = json(canceled).await;
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(canceled["cancellation_reason"], "requested_by_customer");
    assert_eq!(
        sim_stats(&sim).await["refunds_created"],
        1,
        "the release is a refund of the uncaptured charge"
    );

    let automatic = create(&app, &key, "p2", &visa(500)).await["id"].as_str().unwrap().to_owned();
    let refused =
        app.post(&format!("/v1/payments/{automatic}/cancel"), &key, Some("x2"), &json!({})).await;
    assert_problem(refused, 400, "payment_unexpected_state").await;
    let capture_canceled =
        app.post(&format!("/v1/payments/{id}/capture"), &key, Some("x3"), &json!({})).await;
    assert_problem(capture_canceled, 400, "payment_unexpected_state").await;
}

/// A capture the processor refuses leaves the payment awaiting capture; a second capture, under
/// another key and with another amount, is asked of the processor anew and gets its own answer (a
/// downstream key per payment made it an idempotency error, read as a reused key and flagged for
/// a person, leaving the payment `processing`). Here the authorization was released at the
/// processor behind the API's back (as when it expires), so both are refused.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_second_capture_after_a_refused_one_gets_its_own_answer(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let (id, intent) = authorized(&app, &key, "p1", &pool).await;
    at_processor(&sim, &format!("/v1/payment_intents/{intent}/cancel"), &[]).await;

    let path = format!("/v1/payments/{id}/capture");
    let first = app.post(&path, &key, Some("c1"), &json!({})).await;
    assert_eq!(first.status(), 400);
    let first = json(first).await;
    let second = app.post(&path, &key, Some("c2"), &json!({"amount_to_capture": 100})).await;
    assert_eq!(second.status(), 400, "a refusal of its own, not a key for a person");
    assert_eq!(json(second).await["code"], first["code"]);
    let payment = json(app.get(&format!("/v1/payments/{id}"), &key).await).await;
    assert_eq!(payment["status"], "requires_capture");
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT planned_call->>'key' FROM idempotency_keys \
          WHERE idempotency_key IN ('c1', 'c2') ORDER BY idempotency_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1], "each capture its own downstream key: {keys:?}");
}

/// A payment awaiting capture, made with `idem`; its id and its PaymentIntent's.
async fn authorized(app: &TestApp, key: &str, idem: &str, pool: &PgPool) -> (String, String) {
    let manual = json!({"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa", "capture_method": "manual"});
    let id = create(app, key, idem, &manual).await["id"].as_str().unwrap().to_owned();
    let intent =
        sqlx::query_scalar("SELECT processor_payment_intent_id FROM payments WHERE id = $1")
            .bind(&id)
            .fetch_one(pool)
            .await
            .unwrap();
    (id, intent)
}

/// A call made at the stand-in processor behind the API's back.
async fn at_processor(sim: &str, path: &str, form: &[(&str, &str)]) {
    let answer = reqwest::Client::new()
        .post(format!("{sim}{path}"))
        .bearer_auth("sk_test_processor")
        .form(form)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{answer:?}");
}

/// An authorization released behind the API's back (its PaymentIntent canceled at the processor,
/// or expired) makes the processor refuse a cancel as `payment_intent_unexpected_state`. The
/// PaymentIntent says it is canceled, so the cancel adopts that and the payment is canceled (the
/// refusal was replayed for ever, the payment awaiting a capture that could never be). A
/// PaymentIntent captured and then refunded behind the API's back is not canceled: the refusal
/// stands.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_cancel_after_the_authorization_was_released_elsewhere_cancels_the_payment(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let (released, intent) = authorized(&app, &key, "p1", &pool).await;
    at_processor(&sim, &format!("/v1/payment_intents/{intent}/cancel"), &[]).await;

    let path = format!("/v1/payments/{released}/cancel");
    let cancel = app.post(&path, &key, Some("x1"), &json!({})).await;
    assert_eq!(cancel.status(), 200, "the release found, not the refusal answered");
    assert_eq!(json(cancel).await["status"], "canceled");
    let replay = app.post(&path, &key, Some("x1"), &json!({})).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(replay).await["status"], "canceled");
    let causes: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'cause' FROM audit_events \
          WHERE object_id = $1 AND action = 'payment.reconciled'",
    )
    .bind(&released)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(causes, ["moved_on"]);
    let capture = format!("/v1/payments/{released}/capture");
    let capture = app.post(&capture, &key, Some("c1"), &json!({})).await;
    assert_problem(capture, 400, "payment_unexpected_state").await;

    let (captured, intent) = authorized(&app, &key, "p2", &pool).await;
    at_processor(&sim, &format!("/v1/payment_intents/{intent}/capture"), &[]).await;
    at_processor(&sim, "/v1/refunds", &[("payment_intent", intent.as_str())]).await;
    let path = format!("/v1/payments/{captured}/cancel");
    // Captured, then refunded: not a release to adopt.
    let refused = app.post(&path, &key, Some("x2"), &json!({})).await;
    assert_problem(refused, 400, "invalid_request").await;
    let payment = json(app.get(&format!("/v1/payments/{captured}"), &key).await).await;
    assert_eq!(payment["status"], "requires_capture");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn refunds_never_exceed_what_was_captured(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let id = create(&app, &key, "p", &visa(1000)).await["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/payments/{id}/refunds");

    let first = app
        .post(
            &path,
            &key,
            Some("r1"),
            &json!({"amount": 300, "reason": "requested_by_customer", "metadata": {"ticket": "7"}}),
        )
        .await;
    assert_eq!(first.status(), 201);
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let first = json(first).await;
    assert_eq!(first["amount"], 300);
    assert_eq!(first["payment"], id.as_str());
    assert_eq!(first["status"], "succeeded");
    assert!(first["processor_refund_id"].as_str().unwrap().starts_with("re_"));
    assert_eq!(json(app.get(&location, &key).await).await, first);

    let too_much = app.post(&path, &key, Some("r2"), &json!({"amount": 701})).await;
    assert_eq!(assert_problem(too_much, 400, "amount_too_large").await["param"], "amount");
    let rest = json(app.post(&path, &key, Some("r3"), &json!({})).await).await;
    assert_eq!(rest["amount"], 700, "no amount refunds what remains");
    let nothing_left = app.post(&path, &key, Some("r4"), &json!({})).await;
    assert_problem(nothing_left, 400, "amount_too_large").await;

    let payment = json(app.get(&format!("/v1/payments/{id}"), &key).await).await;
    assert_eq!(
        (payment["amount_refunded"].as_i64(), payment["refunded"].as_bool()),
        (Some(1000), Some(true))
    );
    let list = json(app.get(&format!("{path}?limit=1"), &key).await).await;
    assert_eq!(list["data"][0]["id"], rest["id"]);
    assert_eq!(list["has_more"], true);
    assert_eq!(list["url"], path.as_str());
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn lists_page_newest_first_in_strict_creation_order(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            create(&app, &key, &format!("p{n}"), &visa(100 + n)).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    ids.reverse(); // newest first
    let page = json(app.get("/v1/payments?limit=2", &key).await).await;
    let got: Vec<&str> =
        page["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(got, &ids[..2]);
    assert_eq!(page["has_more"], true);
    let next =
        json(app.get(&format!("/v1/payments?limit=2&starting_after={}", ids[1]), &key).await).await;
    let got: Vec<&str> =
        next["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(got, &ids[2..4]);
    let last =
        json(app.get(&format!("/v1/payments?limit=2&starting_after={}", ids[3]), &key).await).await;
    assert_eq!(last["data"].as_array().unwrap().len(), 1);
    assert_eq!(last["has_more"], false);
    let back =
        json(app.get(&format!("/v1/payments?limit=2&ending_before={}", ids[2]), &key).await).await;
    let got: Vec<&str> =
        back["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(got, &ids[..2]);
    assert_eq!(back["has_more"], false);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_patch_merges_description_and_metadata_and_honours_if_match(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa",
                      "description": "old", "metadata": {"a": "1", "b": "2"}});
    let first = app.post("/v1/payments", &key, Some("p"), &body).await;
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    let id = json(first).await["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/payments/{id}");

    let patch = |if_match: &str, body: Value| {
        app.http
            .patch(app.url(&path))
            .bearer_auth(&key)
            .header("content-type", "application/merge-patch+json")
            .header("if-match", if_match.to_owned())
            .body(body.to_string())
    };
    let updated = app
        .send(patch(&etag, json!({"description": null, "metadata": {"a": null, "c": "3"}})))
        .await;
    assert_eq!(updated.status(), 200);
    let new_etag = updated.headers()["etag"].to_str().unwrap().to_owned();
    assert_ne!(new_etag, etag);
    let updated = json(updated).await;
    assert_eq!(updated["description"], Value::Null);
    assert_eq!(updated["metadata"], json!({"b": "2", "c": "3"}));

    let stale = app.send(patch(&etag, json!({"description": "again"}))).await;
    assert_problem(stale, 412, "precondition_failed").await;
    let refused = app.send(patch(&new_etag, json!({"amount": 1}))).await;
    assert_eq!(assert_problem(refused, 400, "invalid_request").await["param"], "amount");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn accounts_never_see_each_others_payments(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool, &[]).await;
    let (_, a) = app.create_account("a").await;
    let (_, b) = app.create_account("b").await;
    let pa = create(&app, &a, "same-key", &visa(500)).await;
    let pb = create(&app, &b, "same-key", &visa(500)).await;
    assert_ne!(pa["id"], pb["id"], "the same client key in two accounts makes two payments");
    assert_eq!(sim_stats(&sim).await["charges_created"], 2);

    let id = pa["id"].as_str().unwrap();
    assert_problem(app.get(&format!("/v1/payments/{id}"), &b).await, 404, "resource_missing").await;
    let capture = app.post(&format!("/v1/payments/{id}/capture"), &b, Some("x"), &json!({})).await;
    assert_problem(capture, 404, "resource_missing").await;
    let refund = app.post(&format!("/v1/payments/{id}/refunds"), &b, Some("y"), &json!({})).await;
    assert_problem(refund, 404, "resource_missing").await;
    let list = json(app.get("/v1/payments", &b).await).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(list["data"][0]["id"], pb["id"]);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn twenty_concurrent_requests_with_one_key_make_one_payment_and_one_charge(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (app, key) = (app.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            app.post("/v1/payments", &key, Some("storm"), &visa(700)).await
        }));
    }
    let mut created = Vec::new();
    for task in tasks {
        let response = task.await.unwrap();
        match response.status().as_u16() {
            201 => created.push(response.bytes().await.unwrap()),
            409 => assert_eq!(response.headers()["retry-after"], "1"),
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(!created.is_empty());
    assert!(created.windows(2).all(|w| w[0] == w[1]), "every 201 is the same answer");
    assert_eq!(count(&pool, "payments").await, 1);
    assert_eq!(sim_stats(&sim).await["charges_created"], 1);
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn ten_concurrent_refunds_of_sixty_percent_let_exactly_one_through(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let id = create(&app, &key, "p", &visa(1000)).await["id"].as_str().unwrap().to_owned();
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for n in 0..10 {
        let (app, key, path) = (app.clone(), key.clone(), format!("/v1/payments/{id}/refunds"));
        tasks.push(tokio::spawn(async move {
            app.post(&path, &key, Some(&format!("r{n}")), &json!({"amount": 600}))
                .await
                .status()
                .as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 400, 400, 400, 400, 400, 400, 400, 400, 400]);
    let refunded: i64 =
        sqlx::query_scalar("SELECT amount_refunded FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(refunded, 600);
    assert_eq!(sim_stats(&sim).await["refunds_created"], 1);
}

/// The second phase of a new payment is one statement that stores an answer computed from the
/// row the first phase wrote. A change to the payment while the charge is on its way (a PATCH of
/// a payment found in the list) makes that statement write nothing, and the phase runs the
/// general way, from the row as it is: the answer, the stored row and the event all show the
/// change, and nothing is written twice (the statement that wrote nothing staged no receipt, no
/// event and no delivery).
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_payment_changed_during_its_charge_is_answered_as_it_is(pool: PgPool) {
    let sim = payments_tests::start_sim(processor_sim::FaultConfig {
        latency_ms: 1500,
        ..Default::default()
    })
    .await;
    let overrides = [
        ("PAYMENTS__PROCESSOR__BASE_URL", sim.as_str()),
        ("PAYMENTS__WEBHOOKS__ALLOW_LOOPBACK", "true"),
    ];
    let app = Arc::new(TestApp::spawn_with(pool.clone(), pool.clone(), &overrides).await);
    let (_, key) = app.create_account("shop").await;
    let endpoint = json!({"url": "http://127.0.0.1:9/webhooks", "enabled_events": ["*"]});
    assert_eq!(app.post("/v1/webhook_endpoints", &key, None, &endpoint).await.status(), 201);
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa",
                      "receipt_email": "buyer@example.com"});
    let creating = {
        let (app, key, body) = (app.clone(), key.clone(), body.clone());
        tokio::spawn(async move { app.post("/v1/payments", &key, Some("k"), &body).await })
    };
    // The payment is listed, `processing`, while the charge is on its way.
    let mut listed = Value::Null;
    for _ in 0..100 {
        let list =
            json(app.send(app.http.get(app.url("/v1/payments")).bearer_auth(&key)).await).await;
        if let Some(payment) = list["data"].as_array().and_then(|data| data.first()) {
            listed = payment.clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(listed["status"], "processing", "{listed}");
    let path = format!("/v1/payments/{}", listed["id"].as_str().unwrap());
    let patched = app
        .send(
            app.http
                .patch(app.url(&path))
                .bearer_auth(&key)
                .header("content-type", "application/merge-patch+json")
                .body(json!({"description": "changed meanwhile"}).to_string()),
        )
        .await;
    assert_eq!(patched.status(), 200);

    let created = creating.await.unwrap();
    assert_eq!(created.status(), 201);
    let created = json(created).await;
    assert_eq!(
        (created["status"].as_str(), created["description"].as_str()),
        (Some("succeeded"), Some("changed meanwhile"))
    );
    let stored = json(app.send(app.http.get(app.url(&path)).bearer_auth(&key)).await).await;
    assert_eq!(stored, created);
    let replayed = json(app.post("/v1/payments", &key, Some("k"), &body).await).await;
    assert_eq!(replayed, created);
    let events: Vec<(String, Value)> =
        sqlx::query_as("SELECT type, object FROM events ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    let succeeded: Vec<&Value> =
        events.iter().filter(|(kind, _)| kind == "payment.succeeded").map(|(_, o)| o).collect();
    assert_eq!(succeeded.len(), 1, "{events:?}");
    assert_eq!(succeeded[0]["description"], "changed meanwhile");
    let jobs: Vec<(String, i64)> =
        sqlx::query_as("SELECT kind, count(*) FROM jobs GROUP BY kind ORDER BY kind")
            .fetch_all(&pool)
            .await
            .unwrap();
    // One receipt; one delivery per event to the one endpoint.
    assert_eq!(jobs, [("receipt".to_owned(), 1), ("webhook".to_owned(), events.len() as i64)]);
    let charged: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'payment.charged'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(charged, 1);
}

/// A key whose call an earlier release froze as a charge (`POST /v1/charges`) is referred to a
/// person and calls nobody: sent as frozen, the charge it answers would not read as a
/// PaymentIntent, and the search for PaymentIntents that follows would find nothing and move the
/// payment to a next generation that charges the card again.
#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_call_an_earlier_release_froze_as_a_charge_is_referred_to_a_person(pool: PgPool) {
    let outage = [("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")];
    let (app, sim) = spawn_with_sim(pool.clone(), &outage).await;
    let (_, key) = app.create_account("shop").await;
    let http = reqwest::Client::new();
    let faults = |rate: f64| json!({"error_rate": rate});
    let set = http.put(format!("{sim}/_sim/faults")).json(&faults(1.0)).send().await.unwrap();
    assert_eq!(set.status(), 200);
    let parked = app.post("/v1/payments", &key, Some("p1"), &visa(500)).await;
    assert_problem(parked, 503, "processor_unavailable").await;
    // As an earlier release froze it.
    let frozen = "UPDATE idempotency_keys SET planned_call = jsonb_set(planned_call, '{path}', \
                  '\"/v1/charges\"'), next_attempt_at = now() WHERE idempotency_key = 'p1'";
    sqlx::query(frozen).execute(&pool).await.unwrap();
    let set = http.put(format!("{sim}/_sim/faults")).json(&faults(0.0)).send().await.unwrap();
    assert_eq!(set.status(), 200);
    let before = sim_stats(&sim).await["requests"].clone();

    let retried = app.post("/v1/payments", &key, Some("p1"), &visa(500)).await;
    assert_problem(retried, 422, "operation_needs_review").await;
    assert_eq!(sim_stats(&sim).await["requests"], before, "nothing was sent");
    let status: String =
        sqlx::query_scalar("SELECT status FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "processing");
}
