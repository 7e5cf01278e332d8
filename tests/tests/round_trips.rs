//! What a request costs the database, counted statement by statement: the figures the README
//! promises. The test's log subscriber is its thread's own (`set_default`): its runtime is
//! single-threaded and runs the server it spawns, so it sees every statement that server sends,
//! and none of the other tests the binary runs meanwhile.

use std::sync::{Arc, Mutex};

use payments_tests::spawn_with_sim;
use serde_json::json;
use sqlx::PgPool;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, filter};

/// Collects the summary of every statement sqlx logs.
#[derive(Clone, Default)]
struct Statements(Arc<Mutex<Vec<String>>>);

/// The statement's full text when sqlx logs it, else its summary.
#[derive(Default)]
struct Summary {
    summary: String,
    statement: String,
}

impl Visit for Summary {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut summary = Summary::default();
        event.record(&mut summary);
        let text =
            if summary.statement.trim().is_empty() { summary.summary } else { summary.statement };
        self.0.lock().unwrap().push(text);
    }
}

impl Statements {
    /// The statements logged since the last call, but for sqlx's lookups of a type it does not
    /// know (`idem_fence`, the fence record): it makes them once per connection, the first time
    /// that connection binds one, and caches the answer, so they cost no request but the first
    /// on each of the pool's connections.
    fn take(&self) -> Vec<String> {
        let logged = std::mem::take(&mut *self.0.lock().unwrap());
        logged.into_iter().filter(|statement| !is_type_lookup(statement)).collect()
    }
}

/// sqlx's catalog queries for a user-defined type: its oid by name, then its kind and fields.
fn is_type_lookup(statement: &str) -> bool {
    statement.contains("::regtype::oid")
        || statement.contains("pg_catalog.pg_type")
        || statement.contains("pg_catalog.pg_attribute")
}

/// Statements the server runs for a request: the ones sqlx logs, plus one `BEGIN` per `COMMIT`
/// (sqlx sends its `BEGIN`s without logging them, and every transaction here ends in a commit).
fn counted_by_the_server(statements: &[String]) -> (usize, usize) {
    let commits = statements.iter().filter(|s| s.trim().eq_ignore_ascii_case("commit")).count();
    (statements.len() + commits, commits)
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_replay_costs_one_statement_and_a_new_payment_two_commits(pool: PgPool) {
    let statements = Statements::default();
    let layer = statements
        .clone()
        .with_filter(filter::Targets::new().with_target("sqlx::query", tracing::Level::TRACE));
    // This thread's own subscriber, whatever another test installed for the process.
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    // Callsites cache whether anyone listens. sqlx's may have been cached as unheard by another
    // test's thread while this subscriber was being registered (a CI run once saw no statement
    // at all): ask every callsite again, now that this subscriber is there.
    tracing::callsite::rebuild_interest_cache();

    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    statements.take();

    // The first request of a key this server has not seen looks the key up on its own.
    assert_eq!(app.post("/v1/payments", &key, Some("first"), &body).await.status(), 201);
    let first = statements.take();
    assert_eq!(first.len(), NEW_PAYMENT_LOGGED.len() + 1, "auth, then as below: {first:#?}");
    assert!(first[0].contains("api_keys") && !first[0].contains("idempotency_keys"), "{first:#?}");

    assert_eq!(app.post("/v1/payments", &key, Some("k"), &body).await.status(), 201);
    let new = statements.take();
    assert_eq!(app.post("/v1/payments", &key, Some("k"), &body).await.status(), 201);
    let replay = statements.take();

    // One statement: the claim's read, which checks the API key and reads the stored answer,
    // writing nothing.
    assert_eq!(replay.len(), 1, "{replay:#?}");
    assert!(
        replay[0].contains("api_keys")
            && replay[0].contains("idempotency_keys")
            && !replay[0].contains("INSERT"),
        "{replay:#?}"
    );

    // A new payment: the claim's read; the first phase, one statement that commits on its own
    // (the payment, its audit record, and the key stored by the fence); the second phase, one
    // transaction (the payment's update with its audit record, the event, the fence that
    // stores the answer).
    assert_eq!(new.len(), NEW_PAYMENT_LOGGED.len(), "{new:#?}");
    for (statement, (what, parts)) in new.iter().zip(NEW_PAYMENT_LOGGED) {
        for part in *parts {
            assert!(statement.contains(part), "{what} should contain {part}: {new:#?}");
        }
    }
    assert!(!new[0].contains("INSERT") && !new[0].contains("UPDATE"), "{new:#?}");
    // As the server counts them, BEGIN and COMMIT included: 7 statements, one block. With the two
    // statements before it that commit on their own, 3 transactions, of which 2 write: the read
    // writes nothing (issue #18: at most 8 statements, two commits).
    assert_eq!(counted_by_the_server(&new), (7, 1), "{new:#?}");
}

/// The statements sqlx logs for a new payment (it does not log its `BEGIN`), each with the
/// parts that identify it.
const NEW_PAYMENT_LOGGED: &[(&str, &[&str])] = &[
    ("the claim's read", &["api_keys", "idempotency_keys"]),
    ("the first phase", &["idem_commit_fence", "INSERT INTO payments", "INSERT INTO audit_events"]),
    ("the payment's update", &["UPDATE payments", "INSERT INTO audit_events"]),
    ("the event", &["INSERT INTO events"]),
    ("the second phase's fence", &["idem_finish"]),
    ("its commit", &["COMMIT"]),
];
