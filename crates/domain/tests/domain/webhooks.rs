//! The account's bound on webhook endpoints, held under concurrent creations; their signing
//! secrets, sealed in their rows.

use std::sync::Arc;
use std::time::Duration;

use payments_domain::events::{self, EventType};
use payments_domain::ids::AccountId;
use payments_domain::webhooks::{
    self, EnabledEvents, MAX_ENDPOINTS_PER_ACCOUNT, SealingKeys, Unsealable,
};
use sqlx::PgPool;

fn keys() -> Arc<SealingKeys> {
    Arc::new(SealingKeys::new([5; 32], []))
}

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
    let keys = keys();
    for _ in 1..MAX_ENDPOINTS_PER_ACCOUNT {
        webhooks::create(&mut conn, &keys, &account, &url, &EnabledEvents::All).await.unwrap();
    }
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM accounts WHERE id = 'acct_1' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let creations: Vec<_> = (0..4)
        .map(|_| {
            let (pool, account, url) = (pool.clone(), account.clone(), url.clone());
            let keys = keys.clone();
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                let all = &EnabledEvents::All;
                webhooks::create(&mut conn, &keys, &account, &url, all).await.is_ok()
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

/// The row holds the signing secret sealed: its bytes hold no trace of the secret the creation's
/// answer shows, the worker's read opens it, and a sealed secret copied into another endpoint's
/// row does not open there.
#[sqlx::test(migrations = "../../migrations")]
async fn the_row_holds_the_secret_sealed_for_its_endpoint_alone(pool: PgPool) {
    sqlx::query("INSERT INTO accounts (id, name) VALUES ('acct_1', 'shop')")
        .execute(&pool)
        .await
        .unwrap();
    let account: AccountId = "acct_1".parse().unwrap();
    let url = url::Url::parse("https://example.com/hook").unwrap();
    let (keys, all) = (keys(), EnabledEvents::All);
    let mut conn = pool.acquire().await.unwrap();
    let first = webhooks::create(&mut conn, &keys, &account, &url, &all).await.unwrap();
    let second = webhooks::create(&mut conn, &keys, &account, &url, &all).await.unwrap();
    let shown = webhooks::reveal_secret(webhooks::created_answer(&first), &keys).unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).unwrap();
    let secret = shown["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");

    let row: Vec<u8> = sqlx::query_scalar("SELECT secret FROM webhook_endpoints WHERE id = $1")
        .bind(first.id.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
    let random = &secret.as_bytes()["whsec_".len()..];
    assert!(!row.windows(random.len()).any(|w| w == random), "the row holds the plain secret");
    let as_text: String =
        sqlx::query_scalar("SELECT encode(secret, 'escape') FROM webhook_endpoints WHERE id = $1")
            .bind(first.id.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!as_text.contains(&secret["whsec_".len()..]));

    let event = events::record(&mut conn, &account, EventType::PaymentSucceeded, b"{}").await;
    let event = event.unwrap();
    let read = |id| {
        let (pool, event) = (pool.clone(), event.clone());
        async move { webhooks::delivery(&pool, &event, &id).await.unwrap().unwrap().1.unwrap() }
    };
    let delivered = read(first.id.clone()).await;
    assert_eq!(keys.open(&delivered.secret, &first.id).unwrap().expose(), secret);

    // The first endpoint's sealed secret, moved into the second's row.
    sqlx::query(
        "UPDATE webhook_endpoints SET secret = (SELECT secret FROM webhook_endpoints WHERE id = $1) \
          WHERE id = $2",
    )
    .bind(first.id.as_str())
    .bind(second.id.as_str())
    .execute(&pool)
    .await
    .unwrap();
    let moved = read(second.id.clone()).await;
    assert_eq!(moved.secret, delivered.secret, "the same bytes");
    assert_eq!(keys.open(&moved.secret, &second.id).unwrap_err(), Unsealable::Forged);
}

/// After a new sealing key, `reseal` seals every secret again with it (in batches), so that the
/// old key can go; a second run finds nothing left.
#[sqlx::test(migrations = "../../migrations")]
async fn resealing_moves_every_secret_to_the_new_key(pool: PgPool) {
    sqlx::query("INSERT INTO accounts (id, name) VALUES ('acct_1', 'shop')")
        .execute(&pool)
        .await
        .unwrap();
    let account: AccountId = "acct_1".parse().unwrap();
    let url = url::Url::parse("https://example.com/hook").unwrap();
    let (old, all) = (keys(), EnabledEvents::All);
    let mut conn = pool.acquire().await.unwrap();
    let mut secrets = Vec::new();
    for _ in 0..3 {
        let endpoint = webhooks::create(&mut conn, &old, &account, &url, &all).await.unwrap();
        secrets.push((endpoint.id.clone(), old.open(&endpoint.secret, &endpoint.id).unwrap()));
    }
    let rotated = SealingKeys::new([6; 32], [[5; 32]]);
    assert_eq!(webhooks::reseal(&pool, &rotated, 2).await.unwrap(), 3);
    assert_eq!(webhooks::reseal(&pool, &rotated, 2).await.unwrap(), 0);
    let new_only = SealingKeys::new([6; 32], []);
    for (id, secret) in secrets {
        let endpoint = webhooks::find(&pool, &account, &id).await.unwrap().unwrap();
        assert_eq!(endpoint.secret.key_id(), Some(new_only.current_id()));
        assert_eq!(new_only.open(&endpoint.secret, &id).unwrap().expose(), secret.expose());
    }
}
