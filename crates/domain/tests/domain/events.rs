//! The event list is gap-free for a poller: an event whose transaction took
//! its seq first but commits last is not skipped by a poller that walks the list forward with
//! `ending_before`. Each test holds real transactions open on the test database, as two phases
//! running at once do.

use payments_domain::accounts;
use payments_domain::events::{self, EventType};
use payments_domain::ids::{AccountId, EventId};
use payments_domain::payments::Cursor;
use sqlx::{PgPool, Postgres, Transaction};

use crate::support::wait_for_the_feed_to_settle;

const OBJECT: &[u8] = br#"{"id":"pay_1","object":"payment"}"#;

async fn account(pool: &PgPool) -> AccountId {
    accounts::create_account(pool, "shop").await.expect("an account").0.id
}

/// Writes an event in `tx`, as a phase does, and leaves the transaction to the caller.
async fn record(tx: &mut Transaction<'_, Postgres>, account: &AccountId, t: EventType) -> EventId {
    events::record(tx, account, t, OBJECT).await.expect("an event written")
}

/// Writes an event in a transaction of its own, committed.
async fn committed(pool: &PgPool, account: &AccountId, t: EventType) -> EventId {
    let mut tx = pool.begin().await.expect("a transaction");
    let id = record(&mut tx, account, t).await;
    tx.commit().await.expect("committed");
    id
}

/// The account's list, newest first: all of it, or what is newer than `cursor`
/// (`ending_before`), optionally of one type.
async fn listed(
    pool: &PgPool,
    account: &AccountId,
    event_type: Option<EventType>,
    ending_before: Option<&EventId>,
) -> Vec<EventId> {
    let mut conn = pool.acquire().await.expect("a connection");
    let cursor = ending_before.map(|id| Cursor::Before(id.clone()));
    let (page, has_more) = events::list(&mut conn, account, event_type, 100, cursor.as_ref())
        .await
        .expect("a page")
        .expect("the cursor names an event of the account");
    assert!(!has_more, "every test lists fewer than a page");
    page.into_iter().map(|event| event.id).collect()
}

/// A poller: lists what is newer than its cursor and moves the cursor to the newest it got.
#[derive(Default)]
struct Poller {
    cursor: Option<EventId>,
    seen: Vec<EventId>,
}

impl Poller {
    async fn poll(&mut self, pool: &PgPool, account: &AccountId) {
        let page = listed(pool, account, None, self.cursor.as_ref()).await;
        if let Some(newest) = page.first() {
            self.cursor = Some(newest.clone());
        }
        self.seen.extend(page.into_iter().rev());
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_poller_sees_an_event_whose_transaction_took_its_seq_first_and_committed_last(
    pool: PgPool,
) {
    let account = account(&pool).await;
    let first = committed(&pool, &account, EventType::PaymentSucceeded).await;
    wait_for_the_feed_to_settle(&pool).await;
    let mut poller = Poller::default();
    poller.poll(&pool, &account).await;
    assert_eq!(poller.seen, std::slice::from_ref(&first));

    // A takes the earlier seq and stays open; B takes the later one and commits first.
    let mut a = pool.begin().await.expect("transaction A");
    let from_a = record(&mut a, &account, EventType::PaymentCaptured).await;
    let mut b = pool.begin().await.expect("transaction B");
    let from_b = record(&mut b, &account, EventType::RefundSucceeded).await;
    b.commit().await.expect("B committed");
    poller.poll(&pool, &account).await;
    a.commit().await.expect("A committed");
    wait_for_the_feed_to_settle(&pool).await;
    poller.poll(&pool, &account).await;

    // Listed in the order the transactions began writing: A's event, then B's.
    assert_eq!(poller.seen, [first, from_a, from_b], "every event, once");
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_open_transaction_holds_back_its_event_and_every_later_one_until_it_ends(pool: PgPool) {
    let account = account(&pool).await;
    let first = committed(&pool, &account, EventType::PaymentSucceeded).await;
    wait_for_the_feed_to_settle(&pool).await;

    let mut open = pool.begin().await.expect("a transaction left open");
    let pending = record(&mut open, &account, EventType::PaymentCaptured).await;
    let later = committed(&pool, &account, EventType::RefundSucceeded).await;
    assert_eq!(listed(&pool, &account, None, None).await, std::slice::from_ref(&first));
    let refunds = listed(&pool, &account, Some(EventType::RefundSucceeded), None).await;
    assert!(refunds.is_empty(), "the later event is held back from a list by type too");
    assert!(listed(&pool, &account, None, Some(&first)).await.is_empty());
    let read = events::find(&pool, &account, &later).await.expect("a read");
    assert_eq!(read.map(|e| e.id), Some(later.clone()), "a committed event reads at once by id");

    open.commit().await.expect("committed");
    wait_for_the_feed_to_settle(&pool).await;
    assert_eq!(listed(&pool, &account, None, None).await, [later.clone(), pending, first]);
    assert_eq!(listed(&pool, &account, Some(EventType::RefundSucceeded), None).await, [later]);
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_event_written_before_transactions_were_recorded_is_older_than_every_later_one(
    pool: PgPool,
) {
    let account = account(&pool).await;
    let recorded = committed(&pool, &account, EventType::PaymentSucceeded).await;
    // A row from before the `xid` column: NULL, though written after `recorded` (a larger seq).
    sqlx::query(
        "INSERT INTO events (id, account_id, type, object, xid)
         VALUES ('evt_legacy', $1, 'payment.failed', '{}', NULL)",
    )
    .bind(account.as_str())
    .execute(&pool)
    .await
    .expect("a legacy event");
    let legacy = EventId::parse("evt_legacy").unwrap();
    wait_for_the_feed_to_settle(&pool).await;

    assert_eq!(listed(&pool, &account, None, None).await, [recorded.clone(), legacy.clone()]);
    assert_eq!(listed(&pool, &account, None, Some(&legacy)).await, [recorded]);
}
