//! What the domain's database tests share.

use std::time::Duration;

use payments_domain::events;
use payments_testkit::eventually;
use sqlx::PgPool;

/// How long a write transaction of another test (on the same cluster: transaction ids, and so
/// the feed's horizon, are the cluster's) may hold the feed back before a test gives up.
const FEED_SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Waits until every committed event of the test database is in the event list: until no
/// transaction that was running when one was written is running still (`events::list` hides an
/// event until then, and a transaction of a test running beside this one may be one of them).
/// Call it with no transaction of the caller's own open.
pub async fn wait_for_the_feed_to_settle(pool: &PgPool) {
    let settled = || async { events::unlisted(pool).await.expect("the feed's horizon") == 0 };
    let what = "the event feed to settle (a write transaction held it back)";
    eventually(what, FEED_SETTLE_LIMIT, settled).await;
}
