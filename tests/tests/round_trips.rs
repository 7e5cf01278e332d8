//! What a request costs the database, counted statement by statement: the figures the README
//! promises. This file is its own test binary, so it can own the process's log subscriber and see
//! every statement sqlx sends.

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
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[sqlx::test(migrator = "payments_api::MIGRATOR")]
async fn a_replay_costs_one_statement_and_a_new_payment_three_transactions(pool: PgPool) {
    let statements = Statements::default();
    let layer = statements
        .clone()
        .with_filter(filter::Targets::new().with_target("sqlx::query", tracing::Level::TRACE));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();

    let (app, _sim) = spawn_with_sim(pool, &[]).await;
    let (_, key) = app.create_account("shop").await;
    let body = json!({"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"});
    statements.take();

    // The first request of a key this server has not seen looks the key up on its own.
    assert_eq!(app.post("/v1/payments", &key, Some("first"), &body).await.status(), 201);
    let first = statements.take();
    // The final phase writes the payment's event too (the outbox, in the change's transaction).
    assert_eq!(
        first.len(),
        11,
        "auth, claim, 3 statements + commit, 4 statements + commit: {first:#?}"
    );
    assert!(first[0].contains("api_keys") && !first[0].contains("idempotency_keys"), "{first:#?}");

    assert_eq!(app.post("/v1/payments", &key, Some("k"), &body).await.status(), 201);
    let new = statements.take();
    assert_eq!(app.post("/v1/payments", &key, Some("k"), &body).await.status(), 201);
    let replay = statements.take();

    // One statement: the claim, which checks the API key and reads the stored answer.
    assert_eq!(replay.len(), 1, "{replay:#?}");
    assert!(
        replay[0].contains("api_keys") && replay[0].contains("idempotency_keys"),
        "{replay:#?}"
    );
    // The claim (checking the key, a transaction of its own), then two phases of one
    // transaction each: 3 transactions. (sqlx does not log the BEGINs it sends, so 10 statements:
    // the second phase writes the event beside the payment, its audit record and the answer.)
    let commits = new.iter().filter(|s| s.trim().eq_ignore_ascii_case("commit")).count();
    assert_eq!(commits, 2, "{new:#?}");
    assert_eq!(new.len(), 10, "claim, 3 statements + commit, 4 statements + commit: {new:#?}");
    assert!(new.iter().any(|s| s.contains("INSERT INTO events")), "{new:#?}");
    assert!(new[0].contains("api_keys") && new[0].contains("ON CONFLICT"), "{new:#?}");
}
