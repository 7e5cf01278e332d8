//! The fill of `payments-bench --fill N` (`scale.rs`): the scripts of `pgbench/fill/`, run in
//! chunks of payments, with their `{{…}}` words replaced.

use std::time::Instant;

use anyhow::Context as _;
use sqlx::PgPool;

/// The fill of the project's tables (`pgbench/fill/project.sql`).
const PROJECT_FILL: &str = include_str!("../pgbench/fill/project.sql");
/// The fill of the design floor's tables (`pgbench/fill/design.sql`).
const DESIGN_FILL: &str = include_str!("../pgbench/fill/design.sql");

/// One `-- part: name` of a fill script, with its `{{…}}` words replaced.
fn part(script: &str, name: &str, words: &[(&str, String)]) -> anyhow::Result<String> {
    let start = script
        .find(&format!("-- part: {name}\n"))
        .with_context(|| format!("no part `{name}` in the fill script"))?;
    let body = &script[start..];
    let body = body[1..].find("\n-- part: ").map_or(body, |end| &body[..end + 1]);
    let mut text = body.to_owned();
    for (word, value) in words {
        text = text.replace(&format!("{{{{{word}}}}}"), value);
    }
    Ok(text)
}

/// The words of the fill scripts' parts.
fn words(n: u64, account: &str, lo: u64, hi: u64) -> [(&'static str, String); 4] {
    [
        ("n", n.to_string()),
        ("account", account.to_owned()),
        ("lo", lo.to_string()),
        ("hi", hi.to_string()),
    ]
}

/// Fills both databases with `n` payments, `chunk` to a statement, then vacuums and analyzes
/// them as autovacuum would have over the year, and writes everything out (CHECKPOINT).
pub(crate) async fn both(
    pool: &PgPool,
    design: &PgPool,
    account: &str,
    n: u64,
    chunk: u64,
) -> anyhow::Result<()> {
    let started = Instant::now();
    project(pool, account, n, chunk, |lo, hi| async move {
        sqlx::raw_sql(&part(DESIGN_FILL, "chunk", &words(n, account, lo, hi))?)
            .execute(design)
            .await?;
        let rate = hi as f64 / started.elapsed().as_secs_f64().max(1e-3);
        eprintln!("bench: filled {hi} of {n} payments ({rate:.0} a second)");
        anyhow::Ok(())
    })
    .await?;
    // The fill writes its rows before the ones the runs wrote, in the middle of the indexes on an
    // identity (and on the audit trail's key, an identity too), where a page splits in half; the
    // API appends to their right end, where a page splits full. Rebuilt, they are as the API
    // would have left them.
    sqlx::raw_sql(
        "REINDEX INDEX audit_events_pkey; REINDEX INDEX audit_events_key_idx;
         REINDEX INDEX events_seq_key; REINDEX INDEX webhook_attempts_pkey;
         REINDEX INDEX jobs_pkey;",
    )
    .execute(pool)
    .await?;
    eprintln!("bench: vacuuming and analyzing both databases");
    for pool in [pool, design] {
        sqlx::raw_sql("VACUUM (ANALYZE)").execute(pool).await?;
    }
    sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
    Ok(())
}

/// Fills the project's tables with `n` payments, `chunk` to a statement, calling `after` with
/// each chunk's first and last payment number.
pub(crate) async fn project<F, Fut>(
    pool: &PgPool,
    account: &str,
    n: u64,
    chunk: u64,
    mut after: F,
) -> anyhow::Result<()>
where
    F: FnMut(u64, u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    sqlx::raw_sql(&part(PROJECT_FILL, "setup", &words(n, account, 0, 0))?).execute(pool).await?;
    let mut lo = 1;
    while lo <= n {
        let hi = (lo + chunk.max(1) - 1).min(n);
        sqlx::raw_sql(&part(PROJECT_FILL, "chunk", &words(n, account, lo, hi))?)
            .execute(pool)
            .await
            .with_context(|| format!("filling payments {lo} to {hi}"))?;
        after(lo, hi).await?;
        lo = hi + 1;
    }
    sqlx::raw_sql(&part(PROJECT_FILL, "finish", &words(n, account, 0, 0))?).execute(pool).await?;
    Ok(())
}

/// `count` completed keys past a retention of `retention_hours`, for the reaper.
pub(crate) async fn backlog(pool: &PgPool, count: u64, retention_hours: u32) -> anyhow::Result<()> {
    let words = [("count", count.to_string()), ("retention_hours", retention_hours.to_string())];
    sqlx::raw_sql(&part(PROJECT_FILL, "backlog", &words)?).execute(pool).await?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test
mod tests {
    use super::*;

    const ACCOUNT: &str = "acct_benchbenchbenchbenchbe";

    #[test]
    fn every_word_of_every_part_is_replaced() {
        for (name, script) in [
            ("setup", PROJECT_FILL),
            ("chunk", PROJECT_FILL),
            ("finish", PROJECT_FILL),
            ("chunk", DESIGN_FILL),
        ] {
            let text = part(script, name, &words(10, ACCOUNT, 1, 10)).unwrap();
            assert!(!text.contains("{{"), "{name}: {text}");
            assert!(!text.contains("-- part: ") || text.starts_with(&format!("-- part: {name}")));
        }
        let backlog = part(
            PROJECT_FILL,
            "backlog",
            &[("count", "5".into()), ("retention_hours", "24".into())],
        )
        .unwrap();
        assert!(!backlog.contains("{{") && backlog.contains("generate_series(1, 5)"));
        assert!(part(PROJECT_FILL, "no such part", &[]).is_err());
    }

    async fn count(pool: &PgPool, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
    }

    /// The fill against the migrations as they are: a year of 40,000 payments in the proportions
    /// and time windows `project.sql` promises, every row older than the running system's.
    #[sqlx::test(migrations = "../../migrations")]
    async fn a_year_of_payments_as_the_default_retention_leaves_it(pool: PgPool) {
        sqlx::query("INSERT INTO accounts (id, name) VALUES ($1, 'bench')")
            .bind(ACCOUNT)
            .execute(&pool)
            .await
            .unwrap();
        let mut chunks = Vec::new();
        project(&pool, ACCOUNT, 40_000, 10_000, |lo, hi| {
            chunks.push((lo, hi));
            async { Ok(()) }
        })
        .await
        .unwrap();
        assert_eq!(chunks, [(1, 10_000), (10_001, 20_000), (20_001, 30_000), (30_001, 40_000)]);
        assert_eq!(count(&pool, "SELECT count(*) FROM payments").await, 40_000);
        assert_eq!(count(&pool, "SELECT count(*) FROM accounts").await, 100);
        let ours = format!("SELECT count(*) FROM payments WHERE account_id = '{ACCOUNT}'");
        assert_eq!(count(&pool, &ours).await, 400);
        // One payment in a hundred is the benchmark's; 3 in 100 refunded, each with two audit records
        // more; one in ten with a receipt.
        assert_eq!(count(&pool, "SELECT count(*) FROM refunds").await, 1_200);
        assert_eq!(count(&pool, "SELECT count(*) FROM audit_events").await, 2 * 40_000 + 2 * 1_200);
        assert_eq!(count(&pool, "SELECT count(*) FROM receipts").await, 4_000);
        // Days before the newest payment: events 29, keys 23 hours, jobs 6; nothing older.
        let days = |table: &str, column: &str| {
            format!(
                "SELECT ceil(extract(epoch FROM (SELECT max(created_at) FROM payments) - min({column}))
                             / 86400)::bigint FROM {table}"
            )
        };
        assert_eq!(count(&pool, &days("payments", "created_at")).await, 365);
        assert_eq!(count(&pool, &days("events", "created_at")).await, 29);
        assert_eq!(count(&pool, &days("processor_events", "received_at")).await, 29);
        assert_eq!(count(&pool, &days("jobs", "done_at")).await, 6);
        assert_eq!(count(&pool, &days("webhook_attempts", "created_at")).await, 29);
        assert_eq!(count(&pool, &days("idempotency_keys", "created_at")).await, 1);
        let events = count(&pool, "SELECT count(*) FROM events").await;
        assert!((3_200..=3_350).contains(&events), "{events} events in 29 days");
        // Every filled row sorts before anything the system writes next, in time order.
        let disorder = "SELECT count(*) FROM (SELECT created_at < lag(created_at) OVER (ORDER BY seq) AS back FROM payments) p WHERE back";
        assert_eq!(count(&pool, disorder).await, 0);
        assert_eq!(count(&pool, "SELECT count(*) FROM payments WHERE seq >= 0").await, 0);
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'bench_fill'"
            )
            .await,
            0
        );

        backlog(&pool, 500, 24).await.unwrap();
        let expired = "SELECT count(*) FROM idempotency_keys WHERE completed_at < now() - interval '24 hours'";
        assert_eq!(count(&pool, expired).await, 500);
    }

    /// The design floor's fill against its own schema.
    #[sqlx::test(migrations = false)]
    async fn the_design_floor_fills_to_the_same_payments(pool: PgPool) {
        sqlx::raw_sql(crate::floor::design::SCHEMA).execute(&pool).await.unwrap();
        for (lo, hi) in [(1, 600), (601, 1_000)] {
            let chunk = part(DESIGN_FILL, "chunk", &words(1_000, ACCOUNT, lo, hi)).unwrap();
            sqlx::raw_sql(&chunk).execute(&pool).await.unwrap();
        }
        for table in ["idempotency_keys", "payments", "jobs"] {
            assert_eq!(
                count(&pool, &format!("SELECT count(*) FROM {table}")).await,
                1_000,
                "{table}"
            );
        }
    }
}
