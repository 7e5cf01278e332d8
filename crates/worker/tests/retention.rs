//! The reaper's retention against a real Postgres: each table that only grows loses its rows past
//! their retention and keeps the others, an event stays while something names it, a pass deletes
//! a bounded number of rows, and rows that may not go yet never hold up older ones behind them.
//! Rows are written with their times in the past, so no test waits for a clock.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test

use std::sync::Arc;

use payments_domain::AccountId;
use payments_domain::retention::Table;
use payments_settings::Settings;
use payments_worker::jobs::LogMailer;
use payments_worker::{MAX_BATCHES_PER_PASS, PassReport, Worker};
use provider::ProcessorClient;
use sqlx::PgPool;
use tokio::sync::watch;

struct Harness {
    pool: PgPool,
    settings: Settings,
    worker: Worker<ProcessorClient>,
    account: AccountId,
}

/// A worker whose settings also have `overrides`, and an account with an endpoint.
async fn harness(pool: PgPool, overrides: &[(&str, &str)]) -> Harness {
    let mut env = vec![("PAYMENTS__WEBHOOKS__SEALING_KEY".to_owned(), "5e".repeat(32))];
    env.extend(overrides.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let settings = Settings::load_from(env).unwrap();
    let worker = worker(&pool, &settings);
    let (account, _, _) = payments_domain::accounts::create_account(&pool, "shop").await.unwrap();
    let account = account.id;
    sqlx::query(
        "INSERT INTO webhook_endpoints (id, account_id, url, enabled_events, secret)
         VALUES ('we_1', $1, 'https://example.com/hook', '{*}', '\\x00')",
    )
    .bind(account.as_str())
    .execute(&pool)
    .await
    .unwrap();
    Harness { pool, settings, worker, account }
}

/// A worker whose walks start at the oldest rows; its reaper calls no processor.
fn worker(pool: &PgPool, settings: &Settings) -> Worker<ProcessorClient> {
    let processor = Arc::new(ProcessorClient::new(settings.processor.client_config()).unwrap());
    Worker::new(pool.clone(), processor, "http://test".into(), settings, Arc::new(LogMailer))
        .unwrap()
}

impl Harness {
    /// One pass of the reaper.
    async fn reap(&self) -> PassReport {
        let (_stop_tx, stop) = watch::channel(false);
        let mut report = PassReport::default();
        self.worker.reap(&stop, &mut report).await.unwrap();
        report
    }

    async fn run(&self, sql: &str, binds: &[&str]) {
        let mut query = sqlx::query(sql);
        for bind in binds {
            query = query.bind(*bind);
        }
        query.execute(&self.pool).await.unwrap();
    }

    /// The event `id`, written `days` ago.
    async fn event(&self, id: &str, days: i32) {
        let sql = "INSERT INTO events (id, account_id, type, object, created_at)
                   VALUES ($1, $2, 'payment.succeeded', '{}', now() - make_interval(days => $3::int))";
        let days = days.to_string();
        self.run(sql, &[id, self.account.as_str(), &days]).await;
    }

    /// An attempt to deliver `event`, made `days` ago.
    async fn attempt(&self, event: &str, days: i32) {
        let sql = "INSERT INTO webhook_attempts (endpoint_id, event_id, attempt, duration_ms,
                                                 outcome, created_at)
                   VALUES ('we_1', $1, 1, 5, 'retrying', now() - make_interval(days => $2::int))";
        self.run(sql, &[event, &days.to_string()]).await;
    }

    /// A job `key`, staged `created` days ago, done or dead (`state`) `days` ago, or pending.
    async fn job(&self, kind: &str, key: &str, created: i32, state: &str, days: i32) {
        let sql = "INSERT INTO jobs (kind, dedupe_key, payload, created_at, done_at, dead_at)
                   VALUES ($1, $2, '{}', now() - make_interval(days => $3::int),
                           CASE WHEN $4 = 'done' THEN now() - make_interval(days => $5::int) END,
                           CASE WHEN $4 = 'dead' THEN now() - make_interval(days => $5::int) END)";
        self.run(sql, &[kind, key, &created.to_string(), state, &days.to_string()]).await;
    }

    /// An audit record about `object`, written `days` ago.
    async fn audit(&self, object: &str, days: i32) {
        let sql = "INSERT INTO audit_events (account_id, object_id, action, created_at)
                   VALUES ($1, $2, 'payment.created', now() - make_interval(days => $3::int))";
        self.run(sql, &[self.account.as_str(), object, &days.to_string()]).await;
    }

    /// The processor's event `id`, received `days` ago.
    async fn processor_event(&self, id: &str, days: i32) {
        let sql = "INSERT INTO processor_events (id, type, object_id, object, created, received_at)
                   VALUES ($1, 'charge.succeeded', 'ch_1', '{}', 0,
                           now() - make_interval(days => $2::int))";
        self.run(sql, &[id, &days.to_string()]).await;
    }

    /// The ids (as text) left in `table`, in order.
    async fn left(&self, table: &str, column: &str) -> Vec<String> {
        let sql = format!("SELECT {column}::text FROM {table} ORDER BY {column}");
        sqlx::query_scalar(&sql).fetch_all(&self.pool).await.unwrap()
    }
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| (*id).to_owned()).collect()
}

#[sqlx::test(migrations = "../../migrations")]
async fn each_table_loses_its_rows_past_retention_and_keeps_the_younger_ones(pool: PgPool) {
    let h = harness(pool, &[]).await;
    h.event("evt_old", 31).await;
    h.event("evt_young", 29).await;
    h.event("evt_attempted", 29).await;
    h.attempt("evt_attempted", 31).await;
    h.attempt("evt_attempted", 29).await;
    h.audit("pay_old", 366).await;
    h.audit("pay_young", 364).await;
    h.processor_event("evt_p_old", 31).await;
    h.processor_event("evt_p_young", 29).await;
    h.job("receipt", "pay_done_old", 9, "done", 8).await;
    h.job("receipt", "pay_done_young", 9, "done", 6).await;

    let report = h.reap().await;

    assert_eq!(h.left("events", "id").await, strings(&["evt_attempted", "evt_young"]));
    assert_eq!(h.left("webhook_attempts", "seq").await, strings(&["2"]));
    assert_eq!(h.left("audit_events", "object_id").await, strings(&["pay_young"]));
    assert_eq!(h.left("processor_events", "id").await, strings(&["evt_p_young"]));
    assert_eq!(h.left("jobs", "dedupe_key").await, strings(&["pay_done_young"]));
    for table in Table::ALL {
        assert_eq!(report.deleted(table), 1, "{}: {report:?}", table.name());
    }
    assert!(report.found_work());
}

#[sqlx::test(migrations = "../../migrations")]
async fn an_event_stays_while_an_attempt_or_a_pending_delivery_names_it(pool: PgPool) {
    let h = harness(pool, &[]).await;
    h.event("evt_attempted", 40).await;
    h.attempt("evt_attempted", 20).await;
    h.event("evt_pending", 40).await;
    h.job("webhook", "evt_pending:we_1", 40, "pending", 0).await;
    h.event("evt_dead", 40).await;
    h.job("webhook", "evt_dead:we_1", 40, "dead", 37).await;
    // Another event's delivery, whose id starts with this one's, does not keep it.
    h.event("evt_p", 40).await;

    h.reap().await;

    let kept = strings(&["evt_attempted", "evt_pending"]);
    assert_eq!(h.left("events", "id").await, kept, "a dead delivery keeps its job, not its event");
    // Once the attempt is past its retention, and the delivery done, the event goes too.
    h.run("UPDATE webhook_attempts SET created_at = now() - interval '31 days'", &[]).await;
    h.run("UPDATE jobs SET done_at = now() WHERE dedupe_key = 'evt_pending:we_1'", &[]).await;
    // Another worker: this one's walk of the events rests a minute after reaching the end.
    let h = Harness { worker: worker(&h.pool, &h.settings), ..h };
    let report = h.reap().await;
    assert_eq!((report.webhook_attempts_deleted, report.events_deleted), (1, 2));
    assert!(h.left("events", "id").await.is_empty());
}

#[sqlx::test(migrations = "../../migrations")]
async fn done_jobs_go_after_seven_days_dead_ones_after_ninety_and_pending_ones_never(pool: PgPool) {
    let h = harness(pool, &[]).await;
    h.job("authentication", "pay_pending", 400, "pending", 0).await;
    h.job("receipt", "pay_dead_young", 120, "dead", 89).await;
    h.job("receipt", "pay_dead_old", 120, "dead", 91).await;
    h.job("receipt", "pay_done_old", 120, "done", 8).await;
    h.job("receipt", "pay_done_late", 120, "done", 6).await;

    let report = h.reap().await;

    let kept = strings(&["pay_dead_young", "pay_done_late", "pay_pending"]);
    assert_eq!(h.left("jobs", "dedupe_key").await, kept);
    assert_eq!(report.jobs_deleted, 2);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_pass_deletes_at_most_its_batches_of_each_table(pool: PgPool) {
    let h = harness(pool, &[("PAYMENTS__RETENTION__BATCH_SIZE", "2")]).await;
    let bound = MAX_BATCHES_PER_PASS as u64 * 2;
    let rows = i32::try_from(bound).unwrap() + 5;
    for n in 0..rows {
        h.event(&format!("evt_{n}"), 31).await;
        h.attempt(&format!("evt_{n}"), 31).await;
        h.audit(&format!("pay_{n}"), 366).await;
        h.processor_event(&format!("evt_p{n}"), 31).await;
        h.job("receipt", &format!("pay_{n}"), 9, "done", 8).await;
    }

    let first = h.reap().await;
    for table in Table::ALL {
        assert_eq!(first.deleted(table), bound, "{}: {first:?}", table.name());
    }
    let second = h.reap().await;
    for table in Table::ALL {
        assert_eq!(second.deleted(table), 5, "{}: {second:?}", table.name());
    }
}

#[sqlx::test(migrations = "../../migrations")]
async fn jobs_that_may_not_go_yet_never_hold_up_older_done_ones_behind_them(pool: PgPool) {
    let h = harness(pool, &[("PAYMENTS__RETENTION__BATCH_SIZE", "2")]).await;
    // More pending and dead jobs at the head than one pass reads, then done ones past retention.
    let head = MAX_BATCHES_PER_PASS * 2 + 5;
    for n in 0..head {
        let state = if n % 2 == 0 { "pending" } else { "dead" };
        h.job("receipt", &format!("pay_head_{n}"), 60, state, 30).await;
    }
    for n in 0..3 {
        h.job("receipt", &format!("pay_done_{n}"), 60, "done", 30).await;
    }

    assert_eq!(h.reap().await.jobs_deleted, 0, "the first pass reads the head only");
    assert_eq!(h.reap().await.jobs_deleted, 3, "the next goes on behind it");
    assert_eq!(h.left("jobs", "id").await.len(), head);
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_reaper_asked_to_stop_deletes_nothing_more(pool: PgPool) {
    let h = harness(pool, &[]).await;
    h.audit("pay_old", 366).await;
    let (stop_tx, stop) = watch::channel(false);
    stop_tx.send(true).unwrap();
    let mut report = PassReport::default();
    h.worker.reap(&stop, &mut report).await.unwrap();
    assert_eq!(report, PassReport::default());
    assert_eq!(h.left("audit_events", "object_id").await, strings(&["pay_old"]));
}

#[sqlx::test(migrations = "../../migrations")]
async fn a_table_whose_batch_fails_holds_up_none_after_it(pool: PgPool) {
    let h = harness(pool, &[]).await;
    h.processor_event("evt_p_old", 31).await;
    // The audit trail comes before the processor's events in a pass; its delete now fails.
    sqlx::query("ALTER TABLE audit_events RENAME TO audit_events_away")
        .execute(&h.pool)
        .await
        .unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let mut report = PassReport::default();
    let pass = h.worker.reap(&stop, &mut report).await;
    assert!(pass.is_err(), "the failure is reported");
    assert_eq!(report.processor_events_deleted, 1);
    assert_eq!(h.left("processor_events", "id").await, Vec::<String>::new());
}
