//! What the domain's database tests share.

use std::time::{Duration, Instant};

use payments_domain::events;
use sqlx::PgPool;

/// How long a write transaction of another test (on the same cluster: transaction ids, and so
/// the feed's horizon, are the cluster's) may hold the feed back before a test gives up.
const FEED_SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Waits until every committed event of the test database is in the event list: until no
/// transaction that was running when one was written is running still (`events::list` hides an
/// event until then, and a transaction of a test running beside this one may be one of them).
/// Call it with no transaction of the caller's own open.
pub async fn wait_for_the_feed_to_settle(pool: &PgPool) {
    let started = Instant::now();
    loop {
        let settled = events::unlisted(pool).await.expect("the feed's horizon") == 0;
        if settled {
            return;
        }
        assert!(
            started.elapsed() < FEED_SETTLE_LIMIT,
            "a write transaction held the event feed back for {FEED_SETTLE_LIMIT:?}"
        );
        sqlx::query("SELECT pg_sleep(0.01)").execute(pool).await.expect("a pause");
    }
}
