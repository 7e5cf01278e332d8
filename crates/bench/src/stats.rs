//! Statements and transactions, counted by the server: `pg_stat_statements` per role, and the
//! database's transaction counter.

use std::time::Duration;

use sqlx::PgPool;

/// What one role sent since the last reset.
#[derive(Debug, Default, Clone, Copy)]
pub struct RoleCalls {
    /// Every statement, BEGIN and COMMIT included.
    pub statements: i64,
    /// Statements other than BEGIN, COMMIT and ROLLBACK.
    pub queries: i64,
    /// Explicit transactions (BEGIN).
    pub begins: i64,
}

/// Forgets every statement counted so far.
pub async fn reset(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_stat_statements_reset()").execute(pool).await.map(drop)
}

/// What `role` sent to this database since the last [`reset`].
pub async fn calls(pool: &PgPool, role: &str) -> sqlx::Result<RoleCalls> {
    let (statements, queries, begins): (Option<i64>, Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT sum(s.calls)::bigint,
                (sum(s.calls) FILTER (WHERE upper(s.query) NOT IN ('BEGIN', 'COMMIT', 'ROLLBACK')))::bigint,
                (sum(s.calls) FILTER (WHERE upper(s.query) = 'BEGIN'))::bigint
           FROM pg_stat_statements s
           JOIN pg_roles r ON r.oid = s.userid
           JOIN pg_database d ON d.oid = s.dbid
          WHERE r.rolname = $1 AND d.datname = current_database()",
    )
    .bind(role)
    .fetch_one(pool)
    .await?;
    Ok(RoleCalls {
        statements: statements.unwrap_or(0),
        queries: queries.unwrap_or(0),
        begins: begins.unwrap_or(0),
    })
}

/// Transactions committed or rolled back in this database, as the statistics system has them.
/// Backends report their counts when they go idle, at most 10 s late ([`settle`] waits for it).
pub async fn transactions(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database
          WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
}

/// Long enough for every idle backend to have reported its transactions (PostgreSQL flushes
/// pending statistics of an idle backend after 10 s).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(11_500)).await;
}
