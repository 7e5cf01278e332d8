//! The record of a waiting payment's outcome (`authentication::settle`), whoever brings it: once,
//! only while the payment `requires_action`, only from the PaymentIntent it records, and nothing
//! while the PaymentIntent has no outcome yet. The webhook and the job each check the status
//! before they settle; this is the check under the row lock that decides when both come at once.

use payments_domain::PaymentId;
use payments_domain::authentication::{self, Settled, SettledBy};
use payments_domain::payments::PaymentStatus;
use provider::PaymentIntent;
use serde_json::json;
use sqlx::PgPool;

/// A payment `pay_1` of `acct_1` that waits on its customer at the processor's `pi_1`.
async fn waiting(pool: &PgPool) -> PaymentId {
    sqlx::raw_sql(
        "INSERT INTO accounts (id, name) VALUES ('acct_1', 'shop');
         INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                               capture_method, payment_method, processor_payment_intent_id,
                               next_action_url)
         VALUES ('pay_1', 'acct_1', 7, 500, 'usd', 'requires_action', 'automatic',
                 'pm_card_threeDSecure2Required', 'pi_1', 'https://pay.example/3ds')",
    )
    .execute(pool)
    .await
    .unwrap();
    PaymentId::parse("pay_1").unwrap()
}

fn intent(id: &str, status: &str) -> PaymentIntent {
    serde_json::from_value(json!({
        "id": id, "object": "payment_intent", "amount": 500, "currency": "usd",
        "status": status, "amount_received": 500, "latest_charge": "ch_1",
        "last_payment_error": if status == "requires_payment_method" {
            json!({"type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds",
                   "message": "Your card has insufficient funds."})
        } else {
            json!(null)
        },
        "metadata": {"payment_id": "pay_1"},
    }))
    .unwrap()
}

async fn settle(pool: &PgPool, id: &PaymentId, intent: &PaymentIntent) -> Settled {
    let mut tx = pool.begin().await.unwrap();
    let settled = authentication::settle(&mut tx, id, intent, SettledBy::Job(1)).await.unwrap();
    tx.commit().await.unwrap();
    settled
}

async fn row(pool: &PgPool) -> (String, Option<String>, Option<String>, i64, i64) {
    sqlx::query_as(
        "SELECT status, next_action_url, processor_charge_id, amount_captured,
                (SELECT count(*) FROM events) FROM payments",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_outcome_is_recorded_once_and_only_from_the_payments_own_intent(pool: PgPool) {
    let id = waiting(&pool).await;
    assert_eq!(settle(&pool, &id, &intent("pi_1", "requires_action")).await, Settled::NotYet);
    assert_eq!(settle(&pool, &id, &intent("pi_other", "succeeded")).await, Settled::NotWaiting);
    assert_eq!(row(&pool).await.0, "requires_action", "neither changed it");

    let succeeded = settle(&pool, &id, &intent("pi_1", "succeeded")).await;
    assert_eq!(succeeded, Settled::Recorded(PaymentStatus::Succeeded, None));
    let once = ("succeeded".to_owned(), None, Some("ch_1".to_owned()), 500, 1);
    assert_eq!(row(&pool).await, once);
    // The other writer, a moment late, with the same news or other news: nothing changes.
    assert_eq!(settle(&pool, &id, &intent("pi_1", "succeeded")).await, Settled::NotWaiting);
    let failed = intent("pi_1", "requires_payment_method");
    assert_eq!(settle(&pool, &id, &failed).await, Settled::NotWaiting);
    assert_eq!(row(&pool).await, once);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_failed_attempt_fails_the_payment_with_its_decline_code(pool: PgPool) {
    let id = waiting(&pool).await;
    let failed = intent("pi_1", "requires_payment_method");
    assert_eq!(settle(&pool, &id, &failed).await, Settled::Recorded(PaymentStatus::Failed, None));
    let (code, message): (String, String) =
        sqlx::query_as("SELECT failure_code, failure_message FROM payments")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("insufficient_funds", "Your card has insufficient funds.")
    );
    let event: String =
        sqlx::query_scalar("SELECT type FROM events").fetch_one(&pool).await.unwrap();
    assert_eq!(event, "payment.failed");
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_cancel_that_crossed_a_last_moment_authentication_cancels_the_payment_awaiting_capture(
    pool: PgPool,
) {
    let id = waiting(&pool).await;
    // The customer authenticated at the last moment: the webhook recorded the authorization.
    let authorized = intent("pi_1", "requires_capture");
    let recorded = settle(&pool, &id, &authorized).await;
    assert_eq!(recorded, Settled::Recorded(PaymentStatus::RequiresCapture, None));
    // The expiry's cancel, sent a moment before, was taken: no capture can succeed now.
    let mut canceled = intent("pi_1", "canceled");
    canceled.cancellation_reason = Some("abandoned".to_owned());
    assert_eq!(
        settle(&pool, &id, &canceled).await,
        Settled::Recorded(PaymentStatus::Canceled, None)
    );
    let (status, reason): (String, String) =
        sqlx::query_as("SELECT status, cancellation_reason FROM payments")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("canceled", "abandoned"));
    // Nothing else moves a payment awaiting capture: its own capture and cancel do.
    sqlx::query("UPDATE payments SET status = 'requires_capture', cancellation_reason = NULL")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(settle(&pool, &id, &intent("pi_1", "succeeded")).await, Settled::NotWaiting);
}
