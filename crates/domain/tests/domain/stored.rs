//! What the domain reads from its tables is typed on the way in: a stored name no variant has,
//! a currency not supported, an id list that does not parse is an error where it is read, never
//! a default. Each test writes a bad value with raw SQL (dropping the rule of the column's domain
//! or its CHECK where one would refuse it, as a row written by another release or by hand could
//! hold it) and reads it through the domain.

use payments_domain::events::{self, EventType};
use payments_domain::ids::{AccountId, EventId, PaymentId, RefundId, WebhookEndpointId};
use payments_domain::jobs::{self, JobKind, ReceiptJob, WebhookJob, Work};
use payments_domain::payments::{self, CancellationReason, CaptureMethod, Cursor, PaymentStatus};
use payments_domain::processor_events::ProcessorEventType;
use payments_domain::refunds::{self, RefundReason, RefundStatus};
use payments_domain::webhooks::{self, EndpointStatus, Outcome};
use payments_domain::{DomainError, accounts};
use serde::Serialize;
use sqlx::{Encode, PgPool, Postgres, Type};

/// An account with one payment, `pay_1`, `succeeded`, and one refund of it, `re_1`.
async fn account_with_a_refunded_payment(pool: &PgPool) -> AccountId {
    let (account, _, _) = accounts::create_account(pool, "shop").await.unwrap();
    sql(
        pool,
        &format!(
            "INSERT INTO payments (id, account_id, amount, currency, status, capture_method,
                                   amount_captured, amount_refunded, payment_method)
             VALUES ('pay_1', '{0}', 500, 'usd', 'succeeded', 'automatic', 500, 100,
                     'pm_card_visa');
             INSERT INTO refunds (id, account_id, payment_id, amount, currency, status, reason)
             VALUES ('re_1', '{0}', 'pay_1', 100, 'usd', 'succeeded', 'duplicate')",
            account.id
        ),
    )
    .await;
    account.id
}

fn is_decode_error<T: std::fmt::Debug>(read: &Result<T, DomainError>) -> bool {
    matches!(read, Err(DomainError::Database(sqlx::Error::ColumnDecode { .. })))
}

async fn sql(pool: &PgPool, statement: &str) {
    sqlx::raw_sql(statement).execute(pool).await.unwrap_or_else(|err| panic!("{statement}: {err}"));
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_payment_with_an_unknown_stored_value_is_an_error_not_a_default(pool: PgPool) {
    let account = account_with_a_refunded_payment(&pool).await;
    let id = PaymentId::parse("pay_1").unwrap();
    let read = payments::find(&pool, &account, &id).await.expect("the good row reads");
    assert_eq!(
        read.map(|p| (p.status, p.capture_method)),
        Some((PaymentStatus::Succeeded, CaptureMethod::Automatic))
    );
    sql(
        &pool,
        "ALTER DOMAIN payment_status DROP CONSTRAINT payment_status_known;
         ALTER DOMAIN capture_method DROP CONSTRAINT capture_method_known",
    )
    .await;
    for bad in [
        "status = 'pending'",
        "status = 'Succeeded'",
        // A `manual` payment read as `automatic` would be captured with its authorization.
        "capture_method = 'delayed'",
        "capture_method = ''",
        "capture_method = 'Manual'",
        "cancellation_reason = 'bored'",
        "currency = 'xyz'",
    ] {
        sql(&pool, &format!("UPDATE payments SET {bad}")).await;
        let found = payments::find(&pool, &account, &id).await;
        assert!(is_decode_error(&found), "{bad}: {found:?}");
        let listed = payments::list(&pool, &account, 10, None).await;
        assert!(is_decode_error(&listed), "{bad}: {listed:?}");
        sql(
            &pool,
            "UPDATE payments SET status = 'succeeded', capture_method = 'automatic',
                                 cancellation_reason = NULL, currency = 'usd'",
        )
        .await;
    }
    assert!(payments::find(&pool, &account, &id).await.is_ok(), "the row reads again");
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_refund_with_an_unknown_stored_value_is_an_error(pool: PgPool) {
    let account = account_with_a_refunded_payment(&pool).await;
    let id = RefundId::parse("re_1").unwrap();
    let payment = PaymentId::parse("pay_1").unwrap();
    let read = refunds::find(&pool, &account, &id).await.expect("the good row reads").unwrap();
    assert_eq!(
        (read.status, read.reason),
        (RefundStatus::Succeeded, Some(RefundReason::Duplicate))
    );
    sql(
        &pool,
        "ALTER DOMAIN refund_status DROP CONSTRAINT refund_status_known;
         ALTER DOMAIN refund_reason DROP CONSTRAINT refund_reason_known",
    )
    .await;
    for bad in ["status = 'refunded'", "reason = 'mistake'", "currency = 'xyz'"] {
        sql(&pool, &format!("UPDATE refunds SET {bad}")).await;
        let found = refunds::find(&pool, &account, &id).await;
        assert!(is_decode_error(&found), "{bad}: {found:?}");
        let listed = refunds::list(&pool, &payment, 10, None::<&Cursor<RefundId>>).await;
        assert!(is_decode_error(&listed), "{bad}: {listed:?}");
        sql(&pool, "UPDATE refunds SET status = 'succeeded', reason = NULL, currency = 'usd'")
            .await;
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_event_of_an_unknown_type_is_an_error(pool: PgPool) {
    let account = account_with_a_refunded_payment(&pool).await;
    sql(
        &pool,
        "INSERT INTO events (id, account_id, type, object)
         SELECT 'evt_1', id, 'payment.created', '{}' FROM accounts",
    )
    .await;
    let id = EventId::parse("evt_1").unwrap();
    assert!(is_decode_error(&events::find(&pool, &account, &id).await));
    // Listed only once no transaction older than its own runs (another test's may).
    crate::support::wait_for_the_feed_to_settle(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    assert!(is_decode_error(&events::list(&mut conn, &account, None, 10, None).await));
    sql(&pool, "UPDATE events SET type = 'payment.succeeded'").await;
    let event = events::find(&pool, &account, &id).await.unwrap().unwrap();
    assert_eq!(event.event_type, EventType::PaymentSucceeded);
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_endpoint_with_an_unknown_status_or_event_type_is_an_error(pool: PgPool) {
    let account = account_with_a_refunded_payment(&pool).await;
    sql(
        &pool,
        "INSERT INTO webhook_endpoints (id, account_id, url, enabled_events, secret)
         SELECT 'we_1', id, 'https://example.com/', '{payment.failed}', '\\x01' FROM accounts;
         INSERT INTO events (id, account_id, type, object)
         SELECT 'evt_1', id, 'payment.failed', '{}' FROM accounts;
         INSERT INTO webhook_attempts (endpoint_id, event_id, attempt, duration_ms, outcome)
         VALUES ('we_1', 'evt_1', 1, 5, 'delivered');
         ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_status_check;
         ALTER TABLE webhook_attempts DROP CONSTRAINT webhook_attempts_outcome_check",
    )
    .await;
    let id = WebhookEndpointId::parse("we_1").unwrap();
    let event = EventId::parse("evt_1").unwrap();
    let endpoint = webhooks::find(&pool, &account, &id).await.unwrap().unwrap();
    assert_eq!(endpoint.status, EndpointStatus::Enabled);
    for bad in ["status = 'paused'", "enabled_events = '{payment.nope}'"] {
        sql(&pool, &format!("UPDATE webhook_endpoints SET {bad}")).await;
        let found = webhooks::find(&pool, &account, &id).await;
        assert!(is_decode_error(&found), "{bad}: {found:?}");
        assert!(is_decode_error(&webhooks::list(&pool, &account).await), "{bad}");
        sql(
            &pool,
            "UPDATE webhook_endpoints SET status = 'enabled', enabled_events = '{payment.failed}'",
        )
        .await;
    }
    // The delivery job reads the endpoint in its own statement.
    sql(&pool, "UPDATE webhook_endpoints SET enabled_events = '{payment.nope}'").await;
    assert!(is_decode_error(&webhooks::delivery(&pool, &event, &id).await));
    sql(&pool, "UPDATE webhook_endpoints SET enabled_events = '{*}'").await;
    assert_eq!(webhooks::attempts(&pool, &id, 10).await.unwrap().len(), 1);
    sql(&pool, "UPDATE webhook_attempts SET outcome = 'lost'").await;
    assert!(is_decode_error(&webhooks::attempts(&pool, &id, 10).await));
    assert!(is_decode_error(&webhooks::recent_deliveries(&pool, 10).await));
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_job_this_code_cannot_read_is_claimed_as_an_error_beside_the_jobs_it_can(pool: PgPool) {
    account_with_a_refunded_payment(&pool).await;
    let receipt = Work::Receipt(ReceiptJob {
        payment_id: PaymentId::parse("pay_1").unwrap(),
        email: "jo@example.com".into(),
    });
    let mut conn = pool.acquire().await.unwrap();
    jobs::stage(&mut conn, &receipt).await.unwrap();
    sql(
        &pool,
        r#"INSERT INTO jobs (kind, dedupe_key, payload) VALUES
             ('fax', 'a', '{"payment_id": "pay_1"}'),
             ('receipt', 'b', '{"payment_id": 5, "email": "jo@example.com"}'),
             ('receipt', 'c', '{"payment_id": "re_1", "email": "jo@example.com"}')"#,
    )
    .await;
    let mut claimed = jobs::claim(&pool, 10, std::time::Duration::from_secs(60)).await.unwrap();
    assert_eq!(claimed.len(), 4, "every due job is claimed: {claimed:?}");
    claimed.sort_by_key(|job| job.id);
    let mut read = claimed.into_iter().map(|job| job.work);
    assert_eq!(read.next(), Some(Ok(receipt)), "a staged job reads back as it was staged");
    for (job, kind) in read.zip(["fax", "receipt", "receipt"]) {
        let err = job.expect_err("a job that does not parse is an error");
        assert_eq!(err.kind, kind, "{err}");
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_delivery_staged_with_its_event_reads_back_as_a_webhook_job(pool: PgPool) {
    let account = account_with_a_refunded_payment(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let url = url::Url::parse("https://example.com/hook").unwrap();
    let all = webhooks::EnabledEvents::All;
    let keys = webhooks::SealingKeys::new([5; 32], []);
    let endpoint = webhooks::create(&mut conn, &keys, &account, &url, &all).await.unwrap();
    let event = events::record(&mut conn, &account, EventType::RefundFailed, b"{}").await.unwrap();
    let claim = std::time::Duration::from_secs(60);
    let others = jobs::claim(&pool, 10, claim).await.unwrap();
    assert!(others.is_empty(), "deliveries are claimed apart from other jobs: {others:?}");
    let caps = payments_domain::deliveries::Caps { per_endpoint: 2, per_account: 8 };
    let claimed = payments_domain::deliveries::claim(&pool, 10, caps, claim).await.unwrap();
    let work: Vec<_> = claimed.into_iter().map(|job| job.work).collect();
    let delivery = Work::Webhook(WebhookJob { event_id: event, endpoint_id: endpoint.id });
    assert_eq!(work, [Ok(delivery)]);
}

/// The text sqlx binds for `value`, as Postgres received it.
async fn stored_name<T>(pool: &PgPool, value: T) -> String
where
    T: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send,
{
    sqlx::query_scalar("SELECT $1::text").bind(value).fetch_one(pool).await.unwrap()
}

/// Asserts that every value is stored under its public name (serde's), and reads back from it.
async fn names_agree<T>(pool: &PgPool, values: &[T])
where
    T: for<'q> Encode<'q, Postgres>
        + for<'r> sqlx::Decode<'r, Postgres>
        + Type<Postgres>
        + Serialize
        + std::fmt::Debug
        + PartialEq
        + Copy
        + Send
        + Unpin,
{
    for &value in values {
        let public = serde_json::to_value(value).unwrap();
        let stored = stored_name(pool, value).await;
        assert_eq!(public, serde_json::Value::String(stored.clone()), "{value:?}");
        let read: T = sqlx::query_scalar("SELECT $1").bind(stored).fetch_one(pool).await.unwrap();
        assert_eq!(read, value);
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn every_stored_name_is_the_public_name(pool: PgPool) {
    names_agree(&pool, &PaymentStatus::ALL).await;
    names_agree(&pool, &CaptureMethod::ALL).await;
    names_agree(&pool, &CancellationReason::ALL).await;
    names_agree(&pool, &RefundStatus::ALL).await;
    names_agree(&pool, &RefundReason::ALL).await;
    names_agree(&pool, &EventType::ALL).await;
    names_agree(&pool, &ProcessorEventType::ALL).await;
    names_agree(&pool, &EndpointStatus::ALL).await;
    names_agree(&pool, &Outcome::ALL).await;
    names_agree(&pool, &JobKind::ALL).await;
}

/// Reads `json` as the stored input of an operation, and checks that what this release stores
/// for it reads back the same.
fn stored_input<T>(json: serde_json::Value) -> T
where
    T: Serialize + serde::de::DeserializeOwned + std::fmt::Debug + PartialEq,
{
    let read: T =
        serde_json::from_value(json.clone()).unwrap_or_else(|err| panic!("{json}: {err}"));
    let stored = serde_json::to_value(&read).unwrap();
    assert_eq!(serde_json::from_value::<T>(stored).unwrap(), read, "{json}");
    read
}

#[test]
fn the_input_stored_with_a_key_reads_back_typed() {
    use payments_domain::operations::CreateEndpointParams;
    use payments_domain::operations::UpdateParams;
    use payments_domain::operations::{
        CancelParams, CaptureParams, CreatePaymentParams, RefundParams,
    };
    use payments_domain::webhooks::EnabledEvents;
    use serde_json::json;

    // As a key stores them: optional members `null`, or absent.
    let create: CreatePaymentParams = stored_input(json!({
        "account_id": "acct_1",
        "request": {"amount": 500, "currency": "usd", "payment_method": "pm_card_visa",
                    "capture_method": "manual", "description": null, "receipt_email": null},
    }));
    assert_eq!((create.request.amount.get(), create.request.currency.as_str()), (500, "usd"));
    assert_eq!(create.request.capture_method, CaptureMethod::Manual);
    assert!(create.request.metadata.is_empty());
    let capture: CaptureParams = stored_input(
        json!({"account_id": "acct_1", "payment_id": "pay_1", "amount_to_capture": 300}),
    );
    assert_eq!(capture.amount_to_capture.map(|a| a.get()), Some(300));
    let cancel: CancelParams = stored_input(
        json!({"account_id": "acct_1", "payment_id": "pay_1", "cancellation_reason": "abandoned"}),
    );
    assert_eq!(cancel.cancellation_reason, Some(CancellationReason::Abandoned));
    let refund: RefundParams = stored_input(json!({
        "account_id": "acct_1", "payment_id": "pay_1",
        "request": {"amount": null, "reason": "fraudulent", "metadata": {"k": "v"}},
    }));
    assert_eq!(
        (refund.request.amount, refund.request.reason),
        (None, Some(RefundReason::Fraudulent))
    );
    let update: UpdateParams = stored_input(json!({
        "account_id": "acct_1", "payment_id": "pay_1",
        "patch": {"metadata": {"gone": null, "kept": "v"}}, "if_match": null,
    }));
    assert_eq!(update.patch.description, None, "an absent member stays absent");
    assert_eq!(
        serde_json::to_value(&update.patch).unwrap(),
        json!({"metadata": {"gone": null, "kept": "v"}})
    );
    let endpoint: CreateEndpointParams = stored_input(json!({
        "account_id": "acct_1", "url": "https://example.com/hook", "enabled_events": ["*"],
    }));
    assert_eq!(endpoint.enabled_events, EnabledEvents::All);
}

#[test]
fn stored_input_with_a_value_no_request_could_have_sent_does_not_parse() {
    use payments_domain::operations::{CaptureParams, CreatePaymentParams};
    use serde_json::json;

    let request = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa",
                         "capture_method": "automatic"});
    let with = |member: &str, value: serde_json::Value| {
        let mut request = request.clone();
        match value {
            serde_json::Value::Null => request.as_object_mut().unwrap().remove(member),
            value => request.as_object_mut().unwrap().insert(member.to_owned(), value),
        };
        json!({"account_id": "acct_1", "request": request})
    };
    assert!(serde_json::from_value::<CreatePaymentParams>(with("amount", json!(500))).is_ok());
    for bad in [
        with("amount", json!(0)),
        with("currency", json!("USD")),
        with("capture_method", json!("delayed")),
        // No default: the capture method decides whether the money moves now.
        with("capture_method", serde_json::Value::Null),
    ] {
        assert!(serde_json::from_value::<CreatePaymentParams>(bad.clone()).is_err(), "{bad}");
    }
    let capture = json!({"account_id": "acct_1", "payment_id": "re_1", "amount_to_capture": null});
    assert!(
        serde_json::from_value::<CaptureParams>(capture).is_err(),
        "a refund's id is no payment's"
    );
}

/// The one-statement phase answers with `Changes::apply` of the row it read, and writes with
/// `update`'s `SET`: the two must agree, column by column, for every kind of change.
#[sqlx::test(migrations = "../../migrations")]
async fn changes_apply_as_update_writes_them(pool: PgPool) {
    let account = account_with_a_refunded_payment(&pool).await;
    sql(&pool, "UPDATE payments SET description = 'old', metadata = '{\"a\": \"1\"}'").await;
    let id = PaymentId::parse("pay_1").unwrap();
    let metadata = [("b".to_owned(), "2".to_owned())].into_iter().collect();
    let changes = [
        payments::Changes::default(),
        payments::Changes {
            status: Some(PaymentStatus::Failed),
            amount_captured: Some(0),
            refunded_delta: -100,
            processor_charge_id: Some("ch_1"),
            failure_code: Some("card_declined"),
            failure_message: Some("declined"),
            ..Default::default()
        },
        payments::Changes {
            cancellation_reason: Some(CancellationReason::Duplicate),
            description: Some(None),
            metadata: Some(&metadata),
            ..Default::default()
        },
        payments::Changes {
            description: Some(Some("new")),
            amount_captured: Some(500),
            refunded_delta: 50,
            ..Default::default()
        },
    ];
    for change in &changes {
        let before = payments::find(&pool, &account, &id).await.unwrap().unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let written = payments::update(&mut conn, &id, change, None).await.unwrap();
        assert_eq!(change.apply(&before), written, "{change:?}");
        assert_eq!(payments::find(&pool, &account, &id).await.unwrap().as_ref(), Some(&written));
    }
}
