//! Lists: a page costs what the page holds, not what the account holds (Postgres' own counters
//! say how many rows a page read), the order is the one the client sees, `created` newest
//! first with ties broken by creation sequence, and a cursor retention deleted is a missing one.

use std::time::Duration;

use payments_domain::payments::{self, Cursor};
use payments_domain::{AccountId, PaymentId};
use payments_domain::{events, refunds};
use payments_testkit::eventually;
use payments_tests::{TestApp, assert_problem, json};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

/// Gives the account `count` payments, `bulk{i}` created `i` seconds ago, and fresh statistics.
async fn many_payments(pool: &PgPool, account_id: &str, count: i32) {
    sqlx::query(
        "INSERT INTO payments (id, account_id, amount, currency, status, capture_method,
                               payment_method, created_at)
         SELECT 'pay_bulk' || i, $1, 100, 'usd', 'succeeded', 'automatic', 'pm_card_visa',
                now() - make_interval(secs => i)
           FROM generate_series(1, $2) i",
    )
    .bind(account_id)
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE payments").execute(pool).await.unwrap();
}

/// Rows and index entries this transaction has read from `payments` and its indexes so far, by
/// Postgres' per-transaction counters (not yet flushed, so exact and private to the test).
async fn rows_read(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)
                    + pg_stat_get_xact_tuples_fetched(c.oid))::bigint
           FROM pg_class c WHERE c.relname LIKE 'payments%'",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// How many rows one page read, in a transaction of its own.
async fn cost_of_page(
    pool: &PgPool,
    account_id: &str,
    cursor: Option<Cursor<PaymentId>>,
) -> (i64, Vec<String>) {
    let mut tx = pool.begin().await.unwrap();
    let before = rows_read(&mut tx).await;
    let account_id = AccountId::parse(account_id).unwrap();
    let (page, has_more) =
        payments::list(&mut *tx, &account_id, 10, cursor.as_ref()).await.unwrap().unwrap();
    let read = rows_read(&mut tx).await - before;
    tx.rollback().await.unwrap();
    assert!(has_more);
    assert_eq!(page.len(), 10);
    (read, page.into_iter().map(|p| p.id.into()).collect())
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_page_of_a_large_account_reads_a_few_dozen_rows_in_every_direction(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (account_id, _) = app.create_account("big").await;
    many_payments(&pool, &account_id, 20_000).await;

    let (first_cost, first) = cost_of_page(&pool, &account_id, None).await;
    let expected: Vec<String> = (1..=10).map(|i| format!("pay_bulk{i}")).collect();
    assert_eq!(first, expected, "newest first");

    let after = Cursor::After(PaymentId::parse("pay_bulk5000").unwrap());
    let (after_cost, older) = cost_of_page(&pool, &account_id, Some(after)).await;
    assert_eq!(older.first().map(String::as_str), Some("pay_bulk5001"));

    let before = Cursor::Before(PaymentId::parse("pay_bulk5000").unwrap());
    let (before_cost, newer) = cost_of_page(&pool, &account_id, Some(before)).await;
    assert_eq!(newer.last().map(String::as_str), Some("pay_bulk4999"));
    assert_eq!(newer.first().map(String::as_str), Some("pay_bulk4990"));

    for (page, cost) in [("first", first_cost), ("after", after_cost), ("before", before_cost)] {
        assert!(cost <= 60, "the {page} page read {cost} rows of 20,000");
    }
}

/// Walks a list newest first through `starting_after`, `limit` at a time; returns every object.
async fn walk(app: &TestApp, key: &str, path: &str, limit: u32) -> Vec<Value> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(id) => format!("{path}?limit={limit}&starting_after={id}"),
            None => format!("{path}?limit={limit}"),
        };
        let page = json(app.get(&query, key).await).await;
        let data = page["data"].as_array().unwrap().clone();
        cursor = data.last().map(|o| o["id"].as_str().unwrap().to_owned());
        seen.extend(data);
        if page["has_more"] != true {
            return seen;
        }
    }
}

/// Walks back from the oldest through `ending_before`; returns every object, newest first.
async fn walk_back(app: &TestApp, key: &str, path: &str, oldest: &str, limit: u32) -> Vec<Value> {
    let mut seen = Vec::new();
    let mut cursor = oldest.to_owned();
    loop {
        let page =
            json(app.get(&format!("{path}?limit={limit}&ending_before={cursor}"), key).await).await;
        let data = page["data"].as_array().unwrap().clone();
        let Some(first) = data.first() else { return seen };
        cursor = first["id"].as_str().unwrap().to_owned();
        let mut page_items = data;
        page_items.extend(seen);
        seen = page_items;
        if page["has_more"] != true {
            return seen;
        }
    }
}

fn assert_newest_first(objects: &[Value], count: usize) {
    assert_eq!(objects.len(), count);
    let ids: std::collections::HashSet<_> = objects.iter().map(|o| o["id"].clone()).collect();
    assert_eq!(ids.len(), count, "each object once");
    for pair in objects.windows(2) {
        let (newer, older) = (pair[0]["created"].as_i64(), pair[1]["created"].as_i64());
        assert!(
            newer >= older,
            "{} ({newer:?}) listed before {} ({older:?})",
            pair[0]["id"],
            pair[1]["id"]
        );
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn lists_follow_created_even_when_insertion_order_disagrees(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (account_id, key) = app.create_account("shop").await;
    // Inserted in one order, created in another, three to a second: what concurrent
    // transactions that began in one order and inserted in another leave behind.
    sqlx::query(
        "INSERT INTO payments (id, account_id, amount, currency, status, capture_method,
                               payment_method, created_at)
         SELECT 'pay_o' || i, $1, 100, 'usd', 'succeeded', 'automatic', 'pm_card_visa',
                date_trunc('second', now()) - make_interval(secs => (i * 7) % 10)
           FROM generate_series(1, 30) i",
    )
    .bind(&account_id)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO refunds (id, account_id, payment_id, amount, currency, status, created_at)
         SELECT 're_o' || i, $1, 'pay_o1', 1, 'usd', 'succeeded',
                date_trunc('second', now()) - make_interval(secs => (i * 7) % 10)
           FROM generate_series(1, 30) i",
    )
    .bind(&account_id)
    .execute(&pool)
    .await
    .unwrap();

    for path in ["/v1/payments", "/v1/payments/pay_o1/refunds"] {
        let forward = walk(&app, &key, path, 7).await;
        assert_newest_first(&forward, 30);
        let oldest = forward.last().unwrap()["id"].as_str().unwrap();
        let mut backward = walk_back(&app, &key, path, oldest, 4).await;
        backward.push(forward.last().unwrap().clone());
        assert_eq!(
            backward, forward,
            "{path}: walking back meets the same objects in the same order"
        );
    }

    // The domain functions agree with the walk (the refund list has the same shape).
    let mut conn = pool.acquire().await.unwrap();
    let payment = PaymentId::parse("pay_o1").unwrap();
    let (page, _) = refunds::list(&mut *conn, &payment, 100, None).await.unwrap().unwrap();
    let created: Vec<i64> = page.iter().map(|r| r.created).collect();
    assert!(created.windows(2).all(|w| w[0] >= w[1]), "{created:?}");
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn an_event_cursor_that_retention_deleted_is_a_missing_resource_naming_the_cursor(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let (account_id, key) = app.create_account("shop").await;
    sqlx::query(
        "INSERT INTO events (id, account_id, type, object, created_at)
         VALUES ('evt_expired', $1, 'payment.succeeded', '{}', now() - interval '31 days'),
                ('evt_kept', $1, 'payment.succeeded', '{}', now() - interval '29 days')",
    )
    .bind(&account_id)
    .execute(&pool)
    .await
    .unwrap();
    let batch = events::delete_expired(&pool, 0, 100, 30).await.unwrap();
    assert_eq!(batch.deleted, 1);
    // The list shows an event once every transaction older than it has ended (other tests' too).
    let settled = || async { events::unlisted(&pool).await.unwrap() == 0 };
    eventually("the feed settled", Duration::from_secs(60), settled).await;

    let listed = json(app.get("/v1/events", &key).await).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    assert_eq!(listed["data"][0]["id"], "evt_kept");
    for param in ["starting_after", "ending_before"] {
        let response = app.get(&format!("/v1/events?{param}=evt_expired"), &key).await;
        let body = assert_problem(response, 404, "resource_missing").await;
        assert_eq!(body["param"], param, "{body}");
    }
    assert_problem(app.get("/v1/events/evt_expired", &key).await, 404, "resource_missing").await;
}
