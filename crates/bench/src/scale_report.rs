//! The tables `payments-bench --fill N` prints (`scale.rs`), in Markdown.

use std::fmt::Write as _;

use sqlx::PgPool;

use crate::floor::FloorRun;
use crate::load::Outcome;
use crate::report::{Report, answers, ms};
use crate::{Args, Scenario};

/// One scenario at one concurrency at one fill level.
#[derive(Debug)]
pub struct ScaleRow {
    /// Payments filled in (0: the fresh database).
    pub level: u64,
    pub scenario: Scenario,
    pub connections: usize,
    pub api: Outcome,
    /// The design floor's run; it has none for the reads.
    pub design: Option<FloorRun>,
    /// The project's floor: the API's own SQL (`new`, `replay`, `storm`) or the least SQL of a
    /// read (`pgbench/reads/`).
    pub floor: FloorRun,
}

/// What a reading scenario read, counted by the server.
#[derive(Debug)]
pub struct Reads {
    pub scenario: Scenario,
    pub table: &'static str,
    pub outcome: Outcome,
    /// Index entries and sequentially read rows of `table`.
    pub read: i64,
    /// Rows the API's statements on `table` returned.
    pub returned: i64,
}

/// The reaper with a backlog, while `new` ran.
#[derive(Debug)]
pub struct Reaper {
    pub connections: usize,
    /// Keys past retention when `new` started, and when it ended.
    pub backlog: i64,
    pub left: i64,
    pub outcome: Outcome,
}

/// Bytes of a database's tables and indexes: (table, index or "" for the table itself, bytes,
/// the table's rows).
#[derive(Debug, Default)]
pub struct Sizes {
    pub payments: i64,
    pub rows: Vec<(String, String, i64, i64)>,
}

impl Sizes {
    fn per_payment(&self, bytes: i64) -> f64 {
        bytes as f64 / self.payments.max(1) as f64
    }

    /// The table's own bytes (with TOAST) and its indexes' together.
    fn table(&self, table: &str) -> Option<(i64, i64, i64)> {
        let own = self.rows.iter().find(|r| r.0 == table && r.1.is_empty())?;
        let indexes = self.rows.iter().filter(|r| r.0 == table && !r.1.is_empty()).map(|r| r.2);
        Some((own.3, own.2, indexes.sum()))
    }
}

/// Everything `--fill` measured.
#[derive(Debug)]
pub struct ScaleReport {
    base: Report,
    fill: u64,
    seconds: u64,
    pub fill_seconds: u64,
    pub rows: Vec<ScaleRow>,
    pub reads: Vec<Reads>,
    pub reaper: Option<Reaper>,
    pub sizes: Sizes,
    pub design_sizes: Sizes,
    pub unused_indexes: Vec<String>,
    /// (table, live rows, dead rows, autovacuum runs, autoanalyze runs)
    pub vacuum: Vec<(String, i64, i64, i64, i64)>,
}

impl ScaleReport {
    pub async fn new(pool: &PgPool, args: &Args) -> sqlx::Result<Self> {
        Ok(Self {
            base: Report::new(pool, args.seconds, args.fanout).await?,
            fill: args.fill,
            seconds: args.seconds,
            fill_seconds: 0,
            rows: Vec::new(),
            reads: Vec::new(),
            reaper: None,
            sizes: Sizes::default(),
            design_sizes: Sizes::default(),
            unused_indexes: Vec::new(),
            vacuum: Vec::new(),
        })
    }

    pub fn render(&self) -> String {
        let mut out = self.base.render_machine();
        let n = self.fill;
        let _ = writeln!(
            out,
            "\n## The same speed with {n} payments behind it ({} s per run; filled in {} s)\n",
            self.seconds, self.fill_seconds
        );
        let _ = writeln!(
            out,
            "| scenario | conns | req/s at 0 | req/s at {n} | {n} / 0 | p99 ms at 0 | p99 ms at {n} \
             | API / design at 0 | API / design at {n} | API / floor at 0 | API / floor at {n} |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for at_n in self.rows.iter().filter(|r| r.level == n) {
            let Some(at_0) = self.rows.iter().find(|r| {
                r.level == 0 && r.scenario == at_n.scenario && r.connections == at_n.connections
            }) else {
                continue;
            };
            let design = |r: &ScaleRow| {
                r.design.as_ref().map_or_else(
                    || "—".to_owned(),
                    |d| format!("{:.0} %", 100.0 * r.api.per_second() / d.per_second.max(1e-9)),
                )
            };
            let floor = |r: &ScaleRow| 100.0 * r.api.per_second() / r.floor.per_second.max(1e-9);
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | **{:.0} %** | {:.2} | {:.2} | {} | {} | {:.0} % | {:.0} % |",
                at_n.scenario.name(),
                at_n.connections,
                at_0.api.per_second(),
                at_n.api.per_second(),
                100.0 * at_n.api.per_second() / at_0.api.per_second().max(1e-9),
                ms(&at_0.api.latency, 99.0),
                ms(&at_n.api.latency, 99.0),
                design(at_0),
                design(at_n),
                floor(at_0),
                floor(at_n),
            );
        }
        let _ = writeln!(out, "\n### Every run\n");
        let _ = writeln!(
            out,
            "| filled | scenario | conns | API req/s | API p50 ms | API p99 ms | design tx/s \
             | design p99 ms | floor tx/s | floor p99 ms | API answers |"
        );
        let _ = writeln!(out, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &self.rows {
            let (design_tps, design_p99) = r.design.as_ref().map_or_else(
                || ("—".to_owned(), "—".to_owned()),
                |d| (format!("{:.0}", d.per_second), format!("{:.2}", ms(&d.latency, 99.0))),
            );
            let failed = r.floor.failed + r.design.as_ref().map_or(0, |d| d.failed);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {design_tps} | {design_p99} | {:.0} | {:.2} | {} |",
                r.level,
                r.scenario.name(),
                r.connections,
                r.api.per_second(),
                ms(&r.api.latency, 50.0),
                ms(&r.api.latency, 99.0),
                r.floor.per_second,
                ms(&r.floor.latency, 99.0),
                answers(&r.api, failed),
            );
        }
        self.render_reads(&mut out);
        self.render_reaper(&mut out);
        self.render_sizes(&mut out);
        out
    }

    fn render_reads(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n## Rows read per row returned, at {} (counted by the server)\n",
            self.fill
        );
        let _ = writeln!(
            out,
            "| scenario | table | requests | rows returned per request | rows read per request \
             | **read / returned** | answers |"
        );
        let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---|");
        for r in &self.reads {
            let requests = r.outcome.requests.max(1) as f64;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} | {:.1} | **{:.2}** | {} |",
                r.scenario.name(),
                r.table,
                r.outcome.requests,
                r.returned as f64 / requests,
                r.read as f64 / requests,
                r.read as f64 / (r.returned.max(1) as f64),
                answers(&r.outcome, 0),
            );
        }
    }

    fn render_reaper(&self, out: &mut String) {
        let Some(reaper) = &self.reaper else { return };
        let elapsed = reaper.outcome.elapsed.as_secs_f64().max(1e-9);
        let created = reaper.outcome.statuses.get(&201).copied().unwrap_or(0);
        let without = self.rows.iter().find(|r| {
            r.level == self.fill
                && r.scenario == Scenario::New
                && r.connections == reaper.connections
        });
        let _ = writeln!(
            out,
            "\n## The reaper while `new` runs at {} connections\n",
            reaper.connections
        );
        let _ = writeln!(
            out,
            "- keys past retention: {} when `new` started, {} when it ended: **{:.0} deleted a second**{}",
            reaper.backlog,
            reaper.left,
            (reaper.backlog - reaper.left) as f64 / elapsed,
            if reaper.left == 0 { " (the backlog ran out first: a lower bound)" } else { "" },
        );
        let _ = writeln!(
            out,
            "- `new` made **{:.0} keys a second** meanwhile",
            created as f64 / elapsed
        );
        let _ = writeln!(
            out,
            "- `new`'s p99: {:.2} ms with the reaper deleting, {} without (the run at {} above); \
             {:.0} requests a second with it",
            ms(&reaper.outcome.latency, 99.0),
            without.map_or_else(
                || "n/a".to_owned(),
                |w| format!("{:.2} ms", ms(&w.api.latency, 99.0))
            ),
            self.fill,
            reaper.outcome.per_second(),
        );
        let _ = writeln!(out, "\n### Autovacuum on the hot tables, over the whole run\n");
        let _ = writeln!(out, "| table | live rows | dead rows | autovacuums | autoanalyzes |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (table, live, dead, vacuums, analyzes) in &self.vacuum {
            let _ = writeln!(out, "| {table} | {live} | {dead} | {vacuums} | {analyzes} |");
        }
    }

    fn render_sizes(&self, out: &mut String) {
        let (s, d) = (&self.sizes, &self.design_sizes);
        let _ = writeln!(
            out,
            "\n## Bytes per payment, at the end ({} payments; the design floor's {})\n",
            s.payments, d.payments
        );
        let _ = writeln!(
            out,
            "| table | rows | rows per payment | table B / payment | indexes B / payment \
             | design floor: table | design floor: indexes |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
        let mut totals = (0.0, 0.0, 0.0, 0.0);
        for (table, _, _, _) in s.rows.iter().filter(|r| r.1.is_empty()) {
            let Some((rows, own, indexes)) = s.table(table) else { continue };
            let design = d.table(table);
            let (dt, di) =
                design.map_or((0.0, 0.0), |(_, t, i)| (d.per_payment(t), d.per_payment(i)));
            totals.0 += s.per_payment(own);
            totals.1 += s.per_payment(indexes);
            totals.2 += dt;
            totals.3 += di;
            let dash = |v: f64| if design.is_some() { format!("{v:.0}") } else { "—".to_owned() };
            let _ = writeln!(
                out,
                "| {table} | {rows} | {:.3} | {:.0} | {:.0} | {} | {} |",
                rows as f64 / s.payments.max(1) as f64,
                s.per_payment(own),
                s.per_payment(indexes),
                dash(dt),
                dash(di),
            );
        }
        let _ = writeln!(
            out,
            "| **all** | | | **{:.0}** | **{:.0}** | **{:.0}** | **{:.0}** |",
            totals.0, totals.1, totals.2, totals.3
        );
        let _ = writeln!(out, "\n### Each index, bytes per payment\n");
        let _ = writeln!(out, "| index | B / payment |");
        let _ = writeln!(out, "|---|---:|");
        for (_, index, bytes, _) in s.rows.iter().filter(|r| !r.1.is_empty()) {
            let _ = writeln!(out, "| {index} | {:.1} |", s.per_payment(*bytes));
        }
        let _ = writeln!(out, "\n### Indexes no statement of the run used\n");
        for index in &self.unused_indexes {
            let _ = writeln!(out, "- {index}");
        }
    }
}
