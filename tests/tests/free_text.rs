//! Free text over HTTP (issue 39): every field a client writes refuses control characters and
//! Unicode format characters (bidirectional overrides, zero-width characters…) with one
//! `400 invalid_request` naming the field (crates/domain/src/text.rs), and stores nothing.

use payments_tests::{TestApp, assert_problem, json, spawn_with_sim};
use serde_json::{Value, json};
use sqlx::PgPool;

/// Characters refused in every field: a right-to-left override, a left-to-right isolate, a
/// zero-width space, a byte-order mark, a soft hyphen.
const FORMAT: [char; 5] = ['\u{202e}', '\u{2066}', '\u{200b}', '\u{feff}', '\u{ad}'];

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The answer is `400 invalid_request` naming `param` and the character.
async fn assert_refused(response: reqwest::Response, param: &str, c: char) {
    let problem = assert_problem(response, 400, "invalid_request").await;
    assert_eq!(problem["param"], param, "{problem}");
    let named = format!("U+{:04X}", u32::from(c));
    assert!(problem["detail"].as_str().unwrap().contains(&named), "{problem}");
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}")).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn format_characters_are_refused_in_a_payments_fields_naming_the_field(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool.clone(), &[]).await;
    let (_, key) = app.create_account("shop").await;
    let base = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    let with = |member: &str, value: Value| {
        let mut body = base.clone();
        body[member] = value;
        body
    };
    for c in FORMAT {
        let cases = [
            (with("description", json!(format!("Two mugs {c}"))), "description"),
            (with("metadata", json!({format!("order{c}"): "42"})), "metadata"),
            (with("metadata", json!({"order": format!("4{c}2")})), "metadata"),
            (with("receipt_email", json!(format!("jo{c}@example.com"))), "receipt_email"),
        ];
        for (body, param) in cases {
            let response = app.post("/v1/payments", &key, Some(&uuid()), &body).await;
            assert_refused(response, param, c).await;
        }
    }
    assert_eq!(count(&pool, "payments").await, 0, "nothing was stored");

    // The same text without the character is taken, lines and all.
    let body = with("description", json!("Two mugs\nand a teapot"));
    let response = app.post("/v1/payments", &key, Some(&uuid()), &body).await;
    assert_eq!(response.status(), 201);
    let id = json(response).await["id"].as_str().unwrap().to_owned();

    for c in FORMAT {
        for (body, param) in [
            (json!({"description": format!("Two mugs {c}")}), "description"),
            (json!({"metadata": {"order": format!("4{c}2")}}), "metadata"),
            (json!({"metadata": {format!("order{c}"): null}}), "metadata"),
        ] {
            let response = app
                .send(
                    app.http
                        .patch(app.url(&format!("/v1/payments/{id}")))
                        .bearer_auth(&key)
                        .json(&body),
                )
                .await;
            assert_refused(response, param, c).await;
        }
        let refund = json!({"metadata": {"why": format!("asked {c}")}});
        let response =
            app.post(&format!("/v1/payments/{id}/refunds"), &key, Some(&uuid()), &refund).await;
        assert_refused(response, "metadata", c).await;
    }
    assert_eq!(count(&pool, "refunds").await, 0, "no refund was made");
    let description: String =
        sqlx::query_scalar("SELECT description FROM payments").fetch_one(&pool).await.unwrap();
    assert_eq!(description, "Two mugs\nand a teapot", "no patch was applied");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn format_characters_are_refused_in_a_webhook_endpoints_url(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (_, key) = app.create_account("shop").await;
    for c in FORMAT.into_iter().chain(['\t', '\n']) {
        let body =
            json!({"url": format!("https://hooks.exa{c}mple.com/x"), "enabled_events": ["*"]});
        let response = app.post("/v1/webhook_endpoints", &key, None, &body).await;
        assert_refused(response, "url", c).await;
    }
    assert_eq!(count(&pool, "webhook_endpoints").await, 0, "nothing was registered");
}
