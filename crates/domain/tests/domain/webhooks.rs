//! The account's bound on webhook endpoints, held under concurrent creations.

use std::time::Duration;

use payments_domain::ids::AccountId;
use payments_domain::webhooks::{self, EnabledEvents, MAX_ENDPOINTS_PER_ACCOUNT};
use sqlx::PgPool;

/// Creations that wait together for the account's lock (held here by another transaction) are
/// counted one after another: one takes the last place, the others are refused, and the account
/// never holds more than its bound. A count read before the lock was granted let each of them
/// pass.
#[sqlx::test(migrations = "../../migrations")]
async fn concurrent_creations_cannot_pass_the_bound_on_endpoints(pool: PgPool) {
    sqlx::query("INSERT INTO accounts (id, name) VALUES ('acct_1', 'shop')")
        .execute(&pool)
        .await
        .unwrap();
    let account: AccountId = "acct_1".parse().unwrap();
    let url = url::Url::parse("https://example.com/hook").unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for _ in 1..MAX_ENDPOINTS_PER_ACCOUNT {
        webhooks::create(&mut conn, &account, &url, &EnabledEvents::All).await.unwrap();
    }
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM accounts WHERE id = 'acct_1' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let creations: Vec<_> = (0..4)
        .map(|_| {
            let (pool, account, url) = (pool.clone(), account.clone(), url.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                webhooks::create(&mut conn, &account, &url, &EnabledEvents::All).await.is_ok()
            })
        })
        .collect();
    // Every creation is waiting for the lock before it is released.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.commit().await.unwrap();
    let mut created = 0;
    for creation in creations {
        created += i64::from(creation.await.unwrap());
    }
    assert_eq!(created, 1, "one creation takes the last place");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_endpoints")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, MAX_ENDPOINTS_PER_ACCOUNT);
}
