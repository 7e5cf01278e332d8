//! Replays answered from memory: kept for the key's account and a credential found live for it,
//! dropped when any API key changes or the key's retention ends.

use std::time::Duration;

use idem::{Claim, EngineConfig, Event, Request};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Harness, accounts_with_keys, harness, harness_with, key, order_claim};

/// Changes a finished key's stored answer and path behind the engine's back (nothing does that
/// but this test), so that a claim shows whether its answer came from memory or from the database.
async fn tamper(pool: &PgPool, key_value: &str) {
    sqlx::query(
        "UPDATE idempotency_keys SET response_body = '\"tampered\"', request_path = '/tampered' \
         WHERE idempotency_key = $1",
    )
    .bind(key_value)
    .execute(pool)
    .await
    .unwrap();
}

/// Finishes `k1` with `credential` and replays it once from the database, which keeps its answer
/// in memory; tampers with the stored answer, and checks that the next replay is the original:
/// from memory.
async fn kept_in_memory(h: &Harness, credential: &[u8]) {
    let Claim::Acquired(lease) = h.claim_with_credential("k1", credential).await else {
        panic!("a live credential claims the key")
    };
    let first = String::from_utf8(h.run(lease).await.unwrap().body).unwrap();
    assert_eq!(replayed_body(h.claim_with_credential("k1", credential).await), first);
    tamper(&h.pool, "k1").await;
    let before = h.events.count(Event::AnsweredFromMemory);
    assert_eq!(
        replayed_body(h.claim_with_credential("k1", credential).await),
        first,
        "from memory"
    );
    assert_eq!(h.events.count(Event::AnsweredFromMemory), before + 1);
}

fn replayed_body(claim: Claim) -> String {
    match claim {
        Claim::Replay(replayed) => String::from_utf8(replayed.body).unwrap(),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// A replay read from the database leaves its answer in memory, and the next one is answered from
/// there; but a key revoked since, by any statement on `api_keys`, is refused at once, as a read
/// of the database would refuse it, and so is a key of another account.
#[sqlx::test(migrations = "../../migrations")]
async fn replays_from_memory_refuse_a_key_revoked_before_they_arrived(pool: PgPool) {
    let h = harness(pool).await;
    accounts_with_keys(&h.pool).await;
    let (live, second, other) = ([0xaa; 32], [0xee; 32], [0xbb; 32]);
    kept_in_memory(&h, &live).await;
    assert!(matches!(h.claim_with_credential("k1", &other).await, Claim::Unauthenticated));
    // The second key of the account was never checked: it reads the database.
    assert_eq!(replayed_body(h.claim_with_credential("k1", &second).await), "\"tampered\"");

    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE id = 'key_live'")
        .execute(&h.pool)
        .await
        .unwrap();
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Unauthenticated));
    // Any change to api_keys moves the version: the live key is checked again, in the database.
    assert_eq!(replayed_body(h.claim_with_credential("k1", &second).await), "\"tampered\"");
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Unauthenticated));
}

/// A copy in memory answers only its own account's key, to a credential found live for that
/// account; a different body under the key is the mismatch the database would answer; and
/// deleting a key from `api_keys` changes the version as a revocation does.
#[sqlx::test(migrations = "../../migrations")]
async fn replays_from_memory_keep_to_their_account_and_answer_mismatches(pool: PgPool) {
    let h = harness(pool).await;
    accounts_with_keys(&h.pool).await;
    let live = [0xaa; 32];
    kept_in_memory(&h, &live).await;
    let (book, pen) = (json!({"item": "book"}), json!({"item": "pen"}));
    let claim = |account, credential: &'static [u8], body| {
        let (h, key) = (&h, key("k1"));
        async move {
            let request =
                Request { credential: Some(credential.into()), ..order_claim(account, &key, body) };
            h.engine.claim(&request).await.unwrap()
        }
    };
    // acct_2's own k1 is another key: new, and once finished, its own answer.
    let Claim::Acquired(lease) = claim("acct_2", &[0xbb; 32], &book).await else {
        panic!("acct_2's k1 is a key of its own")
    };
    let theirs = String::from_utf8(h.run(lease).await.unwrap().body).unwrap();
    assert_eq!(replayed_body(claim("acct_2", &[0xbb; 32], &book).await), theirs);
    assert_ne!(replayed_body(claim("acct_1", &[0xaa; 32], &book).await), theirs);
    // acct_2's key, found live for acct_2, is not acct_1's.
    assert!(matches!(claim("acct_1", &[0xbb; 32], &book).await, Claim::Unauthenticated));

    // The mismatch comes from memory too (the key's path in the database was tampered with).
    match claim("acct_1", &[0xaa; 32], &pen).await {
        Claim::Mismatch { path, .. } => assert_eq!(path, "/orders"),
        other => panic!("expected a mismatch, got {other:?}"),
    }

    sqlx::query("DELETE FROM api_keys WHERE id = 'key_live'").execute(&h.pool).await.unwrap();
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Unauthenticated));
}

/// An answer kept in memory is used only inside the key's retention window by the database
/// clock: past it, the claim reads the key (which the reaper may have deleted, and then the key
/// is new).
#[sqlx::test(migrations = "../../migrations")]
async fn replays_from_memory_end_with_the_keys_retention(pool: PgPool) {
    let retention = Duration::from_secs(5);
    let h = harness_with(pool, EngineConfig { retention, ..EngineConfig::default() }).await;
    accounts_with_keys(&h.pool).await;
    let live = [0xaa; 32];
    kept_in_memory(&h, &live).await;

    tokio::time::sleep(retention).await;
    assert_eq!(replayed_body(h.claim_with_credential("k1", &live).await), "\"tampered\"");
    // The test's own table refers to the key; a payment would not.
    sqlx::query("DELETE FROM orders").execute(&h.pool).await.unwrap();
    let reaped = h.engine.reap(100).await.unwrap();
    assert_eq!(reaped.deleted, 1);
    assert!(matches!(h.claim_with_credential("k1", &live).await, Claim::Acquired(_)));
}

/// With no memory for answers, every replay reads its key.
#[sqlx::test(migrations = "../../migrations")]
async fn without_memory_for_answers_every_replay_reads_its_key(pool: PgPool) {
    let h = harness_with(pool, EngineConfig { answer_memory: 0, ..EngineConfig::default() }).await;
    accounts_with_keys(&h.pool).await;
    let live = [0xaa; 32];
    let Claim::Acquired(lease) = h.claim_with_credential("k1", &live).await else {
        panic!("a live credential claims the key")
    };
    h.run(lease).await.unwrap();
    h.claim_with_credential("k1", &live).await;
    tamper(&h.pool, "k1").await;
    assert_eq!(replayed_body(h.claim_with_credential("k1", &live).await), "\"tampered\"");
}
