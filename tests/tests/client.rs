//! The typed client against the real server: it keeps one key per operation across retries,
//! treats replays as final, and types the API's problems.

use std::time::Duration;

use payments_client::{Client, Code, Error, NewPayment, PaymentStatus, RetryPolicy};
use payments_tests::spawn_with_sim;
use serde_json::json;
use sqlx::PgPool;

fn quick() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 10,
        base: Duration::from_millis(5),
        cap: Duration::from_millis(50),
        ..RetryPolicy::default()
    }
}

/// A client of the API at `address` with the quick policy and five seconds per request.
fn client(address: &str, secret: &str, policy: RetryPolicy) -> Client {
    let builder = Client::builder(address, secret).retry_policy(policy);
    builder.request_timeout(Duration::from_secs(5)).build().unwrap()
}

async fn sim_json(sim: &str, path: &str) -> serde_json::Value {
    reqwest::get(format!("{sim}{path}")).await.unwrap().json().await.unwrap()
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn the_client_survives_lost_processor_answers_with_one_charge(pool: PgPool) {
    // The API's own processor client does not retry, so lost answers reach our client as 503s.
    let (app, sim) = spawn_with_sim(pool, &[("PAYMENTS__PROCESSOR__MAX_RETRIES", "0")]).await;
    let (_, secret) = app.create_account("shop").await;
    reqwest::Client::new()
        .put(format!("{sim}/_sim/faults"))
        .json(&json!({"seed": 3, "lost_response_rate": 0.6}))
        .send()
        .await
        .unwrap();
    let client = client(&app.address, &secret, quick());
    for n in 0..5 {
        let payment = client
            .create_payment(&NewPayment::new(1000 + n, "usd", "pm_card_visa"), None)
            .await
            .unwrap();
        assert_eq!(payment.value.status, "succeeded");
        assert!(uuid::Uuid::parse_str(&payment.key).is_ok(), "a fresh UUIDv4 per operation");
    }
    let stats = sim_json(&sim, "/_sim/stats").await;
    assert!(stats["faults_injected"].as_u64().unwrap() > 0, "answers were lost: {stats}");
    assert_eq!(stats["charges_created"], 5, "one charge per operation, however many retries");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_decline_and_a_reused_key_are_typed_final_errors(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, secret) = app.create_account("shop").await;
    let client = client(&app.address, &secret, quick());
    let declined = client
        .create_payment(&NewPayment::new(500, "usd", "pm_card_chargeDeclined"), Some("d1"))
        .await
        .unwrap_err();
    match &declined {
        Error::Api { code: Code::CardDeclined, problem, key, replayed } => {
            assert_eq!(problem.decline_code.as_deref(), Some("generic_decline"));
            assert!(problem.payment_id.as_deref().unwrap().starts_with("pay_"));
            assert_eq!((key.as_deref(), *replayed), (Some("d1"), false));
        }
        other => panic!("{other:?}"),
    }
    let again = client
        .create_payment(&NewPayment::new(500, "usd", "pm_card_chargeDeclined"), Some("d1"))
        .await
        .unwrap_err();
    assert!(
        matches!(again, Error::Api { code: Code::CardDeclined, replayed: true, .. }),
        "a replayed decline is final too"
    );
    let reused = client
        .create_payment(&NewPayment::new(900, "usd", "pm_card_visa"), Some("d1"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Some(&Code::IdempotencyKeyReused));
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn capture_refund_and_list_through_the_client(pool: PgPool) {
    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, secret) = app.create_account("shop").await;
    let client = client(&app.address, &secret, quick());
    let mut manual = NewPayment::new(1000, "eur", "pm_card_mastercard");
    manual.capture_method = Some("manual".into());
    let authorized = client.create_payment(&manual, None).await.unwrap().value;
    assert_eq!(authorized.status, "requires_capture");
    let captured = client.capture_payment(&authorized.id, Some(800), Some("cap")).await.unwrap();
    assert_eq!((captured.value.amount_captured, captured.replayed), (800, false));
    assert!(client.capture_payment(&authorized.id, Some(800), Some("cap")).await.unwrap().replayed);
    let refund = client.refund_payment(&authorized.id, None, None).await.unwrap().value;
    assert_eq!(refund.amount, 800);
    let read = client.payment(&authorized.id).await.unwrap();
    assert!(read.refunded);
    let page = client.payments(10, None).await.unwrap();
    assert_eq!(page.data[0].id, authorized.id);
    let missing = client.payment("pay_nope").await.unwrap_err();
    assert_eq!(missing.code(), Some(&Code::ResourceMissing));
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_payment_that_requires_action_is_typed_and_cannot_be_captured_or_canceled(pool: PgPool) {
    let (app, sim) = spawn_with_sim(pool, &[]).await;
    let (_, secret) = app.create_account("shop").await;
    let client = client(&app.address, &secret, quick());
    let mut card = NewPayment::new(1200, "usd", "pm_card_threeDSecure2Required");
    card.capture_method = Some("manual".into());
    let waiting = client.create_payment(&card, Some("3ds")).await.unwrap().value;
    assert_eq!(waiting.status, PaymentStatus::RequiresAction);
    let intent = waiting.processor_payment_intent_id.clone().expect("its PaymentIntent");
    assert!(intent.starts_with("pi_"), "{intent}");
    let url = waiting.redirect_url().expect("where to send the customer");
    assert!(url.starts_with(&sim) && url.ends_with(&intent), "{url}");
    let replayed = client.create_payment(&card, Some("3ds")).await.unwrap();
    assert_eq!((replayed.value, replayed.replayed), (waiting.clone(), true));
    let capture = client.capture_payment(&waiting.id, None, Some("cap")).await.unwrap_err();
    assert_eq!(capture.code(), Some(&Code::PaymentRequiresAction), "{capture}");
    let cancel = client.cancel_payment(&waiting.id, Some("cancel")).await.unwrap_err();
    assert_eq!(cancel.code(), Some(&Code::PaymentRequiresAction), "{cancel}");
    assert_eq!(client.payment(&waiting.id).await.unwrap().status, "requires_action");
}

#[tokio::test]
async fn a_client_that_cannot_reach_the_api_gives_up_with_its_key() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let policy = RetryPolicy { max_attempts: 3, ..quick() };
    let client = client(&format!("http://127.0.0.1:{port}"), "sk_test_x", policy);
    match client.create_payment(&NewPayment::new(500, "usd", "pm_card_visa"), Some("keep-me")).await
    {
        Err(Error::GaveUp { key, attempts, .. }) => {
            assert_eq!((key.as_deref(), attempts), (Some("keep-me"), 3))
        }
        other => panic!("{other:?}"),
    }
}
