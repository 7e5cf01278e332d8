//! `payments-bench --fill N`: the same speed with a year of payments behind it?
//!
//! One run, one server, one set of processes: each scenario is measured on the fresh database
//! (the 0 level), then both databases are filled with `N` payments as a year of use leaves them
//! (`pgbench/fill/`: the project's tables with the default retention, the design floor's with
//! every row it keeps), vacuumed and analyzed as autovacuum would have left them, and measured
//! again. Then, at the fill:
//!
//! - rows read per row returned by `get`, `list` and the event poll, counted by the server;
//! - the reaper: a backlog of keys past retention put in its way while `new` runs, and how fast
//!   it deletes them beside how fast `new` makes them;
//! - bytes per payment of every table and index, the design floor's beside them;
//! - the indexes no statement of the run used, and what autovacuum did to the hot tables.

use std::sync::Arc;
use std::time::Instant;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::fill;
use crate::load::{self, Budget, Keys, Outcome};
use crate::scale_report::{Reads, Reaper, ScaleReport, ScaleRow, Sizes};
use crate::{Args, Scenario, System, secs, stats};

/// Cursors each reading scenario cycles through.
const CURSORS: i64 = 2000;

pub(crate) async fn measure(args: &Args, system: System) -> anyhow::Result<()> {
    let System { db, mut api, mut worker, sim, target, account, key_hash, design_url, .. } = system;
    let design_pool = PgPoolOptions::new().max_connections(1).connect(&design_url).await?;
    let mut report = ScaleReport::new(&db.pool, args).await?;
    for level in [0, args.fill] {
        if level > 0 {
            let started = Instant::now();
            fill::both(&db.pool, &design_pool, &account, level, args.fill_chunk).await?;
            report.fill_seconds = started.elapsed().as_secs();
        }
        let paths = cursors(&db.pool, &account).await?;
        let (design, mut floor) = crate::floors(args, &db, &account, &key_hash, &design_url)?;
        floor.define("ncursors", CURSORS.to_string());
        for &scenario in &args.scenarios {
            for &connections in &args.connections {
                eprintln!(
                    "bench: {} at {connections} connection(s), {level} filled",
                    scenario.name()
                );
                let budget = Budget::Time(secs(args.seconds));
                let design_run = match design.has(scenario) {
                    true => Some(design.run(scenario, connections, budget).await?),
                    false => None,
                };
                let floor_run = floor.run(scenario, connections, budget).await?;
                let keys = |run: String| Keys {
                    scenario,
                    run,
                    replay_keys: args.replay_keys,
                    fanout: args.fanout,
                    paths: paths_of(&paths, scenario),
                };
                let run = format!("{}-{connections}-{level}", scenario.name());
                let warmup = Budget::Time(secs(args.warmup));
                load::run(&target, &keys(format!("{run}-warmup")), connections, warmup).await?;
                let api_run = load::run(&target, &keys(run), connections, budget).await?;
                api.check_alive()?;
                worker.check_alive()?;
                report.rows.push(ScaleRow {
                    level,
                    scenario,
                    connections,
                    api: api_run,
                    design: design_run,
                    floor: floor_run,
                });
            }
        }
        if level == args.fill {
            for scenario in [Scenario::Get, Scenario::List, Scenario::Events] {
                let keys = Keys {
                    scenario,
                    run: String::new(),
                    replay_keys: args.replay_keys,
                    fanout: args.fanout,
                    paths: paths_of(&paths, scenario),
                };
                worker.signal("STOP")?;
                let counted = reads(&db.pool, &target, &keys, args.count).await;
                worker.signal("CONT")?;
                report.reads.push(counted?);
            }
        }
    }
    let connections = args.connections.iter().copied().max().unwrap_or(32);
    report.reaper = Some(reaper(&db.pool, &target, args, connections).await?);
    report.sizes = sizes(&db.pool).await?;
    report.design_sizes = sizes(&design_pool).await?;
    report.unused_indexes = unused_indexes(&db.pool).await?;
    report.vacuum = vacuum_counts(&db.pool).await?;
    drop((api, worker, sim));

    let text = report.render();
    println!("{text}");
    let out = args.work_dir.join("scale.md");
    std::fs::write(&out, &text)?;
    eprintln!("bench: wrote {}", out.display());
    Ok(())
}

/// The paths a reading scenario cycles through.
fn paths_of(paths: &[(Scenario, Vec<String>)], scenario: Scenario) -> Arc<[String]> {
    paths
        .iter()
        .find(|(s, _)| *s == scenario)
        .map(|(_, p)| Arc::from(p.as_slice()))
        .unwrap_or_else(|| Arc::from([]))
}

/// Picks the reading scenarios' cursors among the account's rows, numbered in `bench_cursors`
/// for the floors, and returns the paths the API's runs ask for: any payment for `get`; for
/// `list`, a payment with at least 100 older ones; for `events`, an event with at least 100
/// newer ones in the feed's order.
async fn cursors(pool: &PgPool, account: &str) -> anyhow::Result<Vec<(Scenario, Vec<String>)>> {
    let picks = [
        (Scenario::Get, "SELECT id FROM payments WHERE account_id = $1 ORDER BY random() LIMIT $2"),
        (
            Scenario::List,
            "SELECT id FROM payments WHERE account_id = $1
                AND (created_at, seq) > (SELECT created_at, seq FROM payments
                                          WHERE account_id = $1 ORDER BY created_at, seq
                                         OFFSET 100 LIMIT 1)
              ORDER BY random() LIMIT $2",
        ),
        (
            Scenario::Events,
            "SELECT id FROM events WHERE account_id = $1
                AND (coalesce(xid, '0'), seq) < (SELECT coalesce(xid, '0'), seq FROM events
                                                  WHERE account_id = $1
                                                  ORDER BY coalesce(xid, '0') DESC, seq DESC
                                                 OFFSET 100 LIMIT 1)
              ORDER BY random() LIMIT $2",
        ),
    ];
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_cursors;
         CREATE TABLE bench_cursors (scenario text, n int, id text, PRIMARY KEY (scenario, n))",
    )
    .execute(pool)
    .await?;
    let mut paths = Vec::new();
    for (scenario, sql) in picks {
        let ids: Vec<String> =
            sqlx::query_scalar(sql).bind(account).bind(CURSORS).fetch_all(pool).await?;
        anyhow::ensure!(!ids.is_empty(), "no cursors for `{}`", scenario.name());
        sqlx::query(
            "INSERT INTO bench_cursors
             SELECT $1, n, ids[(n - 1) % cardinality(ids) + 1]
               FROM generate_series(1, $2::int) n, (SELECT $3::text[] AS ids) i",
        )
        .bind(scenario.name())
        .bind(CURSORS as i32)
        .bind(&ids)
        .execute(pool)
        .await?;
        let path = |id: &String| match scenario {
            Scenario::Get => format!("/v1/payments/{id}"),
            Scenario::List => format!("/v1/payments?limit=100&starting_after={id}"),
            _ => format!("/v1/events?limit=100&ending_before={id}"),
        };
        paths.push((scenario, ids.iter().map(path).collect()));
    }
    sqlx::raw_sql("ANALYZE bench_cursors").execute(pool).await?;
    Ok(paths)
}

/// Rows the server read for a reading scenario beside the rows its statements returned, over
/// `count` requests on 8 connections (the worker stopped): index entries and sequentially read
/// rows of the table the scenario reads, against `pg_stat_statements`' rows of the API's
/// statements on that table.
async fn reads(
    pool: &PgPool,
    target: &load::Target,
    keys: &Keys,
    count: u64,
) -> anyhow::Result<Reads> {
    let table = if keys.scenario == Scenario::Events { "events" } else { "payments" };
    stats::settle().await;
    stats::reset(pool).await?;
    let before = tuples_read(pool, table).await?;
    let outcome = load::run(target, keys, 8, Budget::Requests(count)).await?;
    stats::settle().await;
    let read = tuples_read(pool, table).await? - before;
    let returned: Option<i64> = sqlx::query_scalar(
        "SELECT sum(s.rows)::bigint FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
          WHERE r.rolname = $1 AND s.query ILIKE '%FROM ' || $2 || '%'",
    )
    .bind(crate::server::API_ROLE)
    .bind(table)
    .fetch_one(pool)
    .await?;
    Ok(Reads { scenario: keys.scenario, table, outcome, read, returned: returned.unwrap_or(0) })
}

/// Index entries and sequentially read rows of `table` so far.
async fn tuples_read(pool: &PgPool, table: &str) -> anyhow::Result<i64> {
    let n: Option<i64> = sqlx::query_scalar(
        "SELECT (coalesce(t.seq_tup_read, 0)
                 + (SELECT coalesce(sum(i.idx_tup_read), 0) FROM pg_stat_user_indexes i
                     WHERE i.relid = t.relid))::bigint
           FROM pg_stat_user_tables t WHERE t.relname = $1",
    )
    .bind(table)
    .fetch_one(pool)
    .await?;
    Ok(n.unwrap_or(0))
}

/// `args.backlog` keys past retention put before the reaper, and `new` run beside it.
async fn reaper(
    pool: &PgPool,
    target: &load::Target,
    args: &Args,
    connections: usize,
) -> anyhow::Result<Reaper> {
    let expired = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM idempotency_keys WHERE completed_at < now() - interval '24 hours'",
        )
        .fetch_one(pool)
        .await
    };
    eprintln!("bench: {} keys past retention for the reaper, while `new` runs", args.backlog);
    fill::backlog(pool, args.backlog, 24).await?;
    let before = expired().await?;
    let keys = Keys {
        scenario: Scenario::New,
        run: "reaper".into(),
        replay_keys: args.replay_keys,
        fanout: args.fanout,
        paths: Arc::from([]),
    };
    let outcome: Outcome =
        load::run(target, &keys, connections, Budget::Time(secs(args.seconds))).await?;
    let after = expired().await?;
    Ok(Reaper { connections, backlog: before, left: after, outcome })
}

/// Bytes of every table (with its TOAST) and index, and the rows of each table.
async fn sizes(pool: &PgPool) -> anyhow::Result<Sizes> {
    let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT t.relname::text, coalesce(i.relname::text, ''),
                CASE WHEN i.oid IS NULL THEN pg_table_size(t.oid) ELSE pg_relation_size(i.oid) END,
                greatest(t.reltuples, 0)::bigint
           FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
           LEFT JOIN LATERAL (SELECT NULL::oid AS oid, NULL::name AS relname
                              UNION ALL
                              SELECT c.oid, c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
                               WHERE x.indrelid = t.oid) i ON true
          WHERE n.nspname = 'public' AND t.relkind = 'r' AND t.relname NOT LIKE '\\_%'
            AND t.relname <> 'bench_cursors'
          ORDER BY 1, i.oid NULLS FIRST",
    )
    .fetch_all(pool)
    .await?;
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(pool).await?;
    Ok(Sizes { payments, rows })
}

/// The API database's indexes that no scan used during the run.
async fn unused_indexes(pool: &PgPool) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT relname::text || '.' || indexrelname::text FROM pg_stat_user_indexes
          WHERE idx_scan = 0 AND relname <> 'bench_cursors' ORDER BY 1",
    )
    .fetch_all(pool)
    .await?)
}

/// Per hot table: live and dead rows, and how often autovacuum and autoanalyze ran.
async fn vacuum_counts(pool: &PgPool) -> anyhow::Result<Vec<(String, i64, i64, i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT relname::text, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count
           FROM pg_stat_user_tables
          WHERE relname IN ('idempotency_keys', 'payments', 'events', 'jobs', 'audit_events',
                            'webhook_attempts', 'processor_events', 'refunds')
          ORDER BY relname",
    )
    .fetch_all(pool)
    .await?)
}
