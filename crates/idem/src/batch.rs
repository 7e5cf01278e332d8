//! Batches: the one-statement phases of one kind that concurrent operations reach at the same
//! time, sent as one statement.
//!
//! A phase that is one statement (`Lease::phase_in_one`) costs Postgres about as much for what
//! every statement costs (opening its tables and indexes, reading their checks, the commit) as
//! for the rows it writes (BENCHMARKS.md, "Session 16"). A [`Batcher`] lets phases of one kind
//! share that: a phase hands it its row and its fence ([`Lease::phase_in_batch`]), and one
//! task sends the rows that arrived while the statement before them ran as one statement of the
//! operation's ([`Batch::send`]). There is no timer: a phase that arrives alone goes at once, in a
//! batch of one; under load a batch holds what queued during the one before it, up to
//! [`MAX_ROWS`].
//!
//! The statement writes every row of the batch or none of it, and each row only where its own
//! checks hold, as the statement of one phase would: a row whose fence cannot move the key
//! (`IL001`: the lease was lost) fails the statement, and so does any other error. Then every
//! row of the batch is sent again alone, on a connection of its phase's own, where each case is
//! handled as it is without batches; so is a row the statement wrote nothing for (its own check
//! did not hold). A batch changes how many phases share a statement, never what one phase writes
//! or how its failures are told apart.
//!
//! The batch runs on the batcher's task, on one connection the task keeps beside the pool (so no
//! connection check is added per batch; with generic plans, as `connect` says why), never on the
//! task of a phase: a request that goes away does not cut a batch off for the others. One batch
//! is in flight at a time; while one has been in flight for [`STUCK`] (waiting for a row lock,
//! say), the rows that arrive go alone instead of queueing behind it, so a batch that waits holds
//! up only the rows it carries (for as long as its slowest row waits, up to the sessions'
//! `statement_timeout`). A phase whose batch was sent but whose answer was lost (the connection
//! broke) does not know whether it committed: it is sent again alone, whose statement then finds
//! the operation's row moved on (its own check) and whose general phase finds the lease gone, as
//! after a phase's commit whose answer was lost without batches.
//!
//! The task's connection is checked with a round trip after a second idle, and closed after a
//! batch that failed; the next batch connects again. A batch, from taking its connection to
//! reading its answer, has a deadline ([`DEADLINE`]): the server cancels a statement that runs
//! or waits for a lock that long (the session's `statement_timeout` and `lock_timeout`), and the
//! task gives up on a connection that stops answering at all (a network that drops packets, a
//! server that froze) shortly after ([`ANSWER_GRACE`]). Its rows go alone, as after a lost answer; the connection
//! is dropped, and the next batch connects again.
//!
//! [`Lease::phase_in_batch`]: crate::Lease::phase_in_batch

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::sync::{mpsc, oneshot};

use crate::FenceRecord;

/// The most rows one statement carries.
pub const MAX_ROWS: usize = 64;

/// One kind of batched statement: how an operation writes many phases' rows at once.
pub trait Batch: Send + Sync + 'static {
    /// What one phase writes, besides its fence.
    type Row: Send + 'static;

    /// Sends one statement that makes the writes of every row of `rows` and calls
    /// `idem_commit_fence` with each row's fence, and answers, for each row in order, the key id
    /// its fence returned, or `None` where its own check did not hold and it wrote nothing (the
    /// statement of one such phase would have answered no row). Called on the batcher's task, on
    /// its connection; like the statement of [`Lease::phase_in_one`] it sends that one statement
    /// and reads its answer to the end, and changes nothing of the session.
    ///
    /// [`Lease::phase_in_one`]: crate::Lease::phase_in_one
    fn send(
        &self,
        connection: &mut PgConnection,
        rows: &[(Self::Row, FenceRecord)],
    ) -> impl Future<Output = Result<Vec<Option<i64>>, sqlx::Error>> + Send;
}

/// A row waiting for its batch, and where its answer goes.
struct Entry<B: Batch> {
    row: B::Row,
    fence: FenceRecord,
    answer: oneshot::Sender<Option<i64>>,
}

/// The batches of one [`Batch`] kind, sent by a task of their own (started with the first row).
pub struct Batcher<B: Batch> {
    shared: Arc<Shared<B>>,
}

struct Shared<B: Batch> {
    queue: OnceLock<mpsc::UnboundedSender<Entry<B>>>,
    batch: Arc<B>,
    pool: PgPool,
    deadline: Duration,
    /// When the batch in flight was sent, if one is.
    in_flight: Arc<Mutex<Option<Instant>>>,
    /// Whether the task was found ended (and said so).
    ended: AtomicBool,
}

impl<B: Batch> Clone for Batcher<B> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone() }
    }
}

impl<B: Batch> std::fmt::Debug for Batcher<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("batch", &std::any::type_name::<B>()).finish()
    }
}

impl<B: Batch> Batcher<B> {
    /// Batches of `batch`, sent on a connection made with `pool`'s options, beside the pool's
    /// own: one more session on the server while the task lives. Each has [`DEADLINE`].
    pub fn new(pool: PgPool, batch: B) -> Self {
        Self::with_deadline(pool, batch, DEADLINE)
    }

    /// [`Batcher::new`] with another deadline for each batch.
    pub fn with_deadline(pool: PgPool, batch: B, deadline: Duration) -> Self {
        let in_flight = Arc::default();
        let (queue, batch, ended) = (OnceLock::new(), Arc::new(batch), AtomicBool::new(false));
        let shared = Shared { queue, batch, pool, deadline, in_flight, ended };
        Self { shared: Arc::new(shared) }
    }

    /// Sends `row` with `fence` in the next batch, and answers the key id its fence returned, or
    /// `None` when the row must be sent alone: its batch failed, it wrote nothing, or the batch's
    /// answer was lost; or the batch in flight has run for [`STUCK`] (waiting for a lock, say),
    /// so that the rows that arrive meanwhile do not wait behind it. Must be called within a
    /// Tokio runtime.
    pub async fn send(&self, row: B::Row, fence: &FenceRecord) -> Option<i64> {
        let stuck = lock(&self.shared.in_flight).is_some_and(|since| since.elapsed() >= STUCK);
        if stuck {
            return None;
        }
        let queue = self.shared.queue.get_or_init(|| {
            let (queue, rows) = mpsc::unbounded_channel();
            let (batch, pool) = (self.shared.batch.clone(), self.shared.pool.clone());
            let (deadline, in_flight) = (self.shared.deadline, self.shared.in_flight.clone());
            tokio::spawn(run(batch, pool, deadline, in_flight, rows));
            queue
        });
        let (answer, answered) = oneshot::channel();
        if queue.send(Entry { row, fence: fence.clone(), answer }).is_err() {
            // The task ended (a panic in `Batch::send`, or the pool closed): every phase goes
            // alone from now on. Said once.
            if !self.shared.ended.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    batch = std::any::type_name::<B>(),
                    "the batcher's task has ended: its phases go alone"
                );
            }
            return None;
        }
        answered.await.ok().flatten()
    }
}

/// How long a batch may be in flight before the rows that arrive go alone instead of queueing
/// behind it. A batch takes milliseconds; one that waits this long waits for something else.
pub const STUCK: Duration = Duration::from_secs(1);

/// How long a batch may take, from its connection to its answer, before it is given up and its
/// rows go alone: the batch connection's `statement_timeout` and `lock_timeout`, and, after
/// [`ANSWER_GRACE`], the task's own bound for a connection that stops answering. As long as
/// [`STUCK`]: a batch that waits that long waits for something else. Part of the lease's margin
/// (`EngineConfig::check_lease_covers`).
pub const DEADLINE: Duration = STUCK;

/// How much longer than the server's bound the task waits for an answer: a statement the server
/// cancelled answers within it.
pub const ANSWER_GRACE: Duration = Duration::from_millis(500);

/// The batch-in-flight mark, whatever a panic elsewhere left it as.
fn lock(in_flight: &Mutex<Option<Instant>>) -> std::sync::MutexGuard<'_, Option<Instant>> {
    in_flight.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long the task's connection may sit idle before it is checked (a round trip) before the
/// next batch: the server may have ended the session meanwhile (a restart, a failover). Under load
/// no batch waits that long. The kept connections' `IDLE_RECHECK`.
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// A connection for batches: the pool's session settings, with statements and lock waits bound
/// by `deadline`, and generic plans from the first execution. A batch's rows are its statement's parameters,
/// so a custom plan, which Postgres keeps choosing when it is cheaper than the generic plan for
/// the rows at hand (and for a few rows it always is), would plan the statement again for every
/// batch: more than the batch saves. The generic plan walks the tables' keys for any number of
/// rows.
async fn connect(pool: &PgPool, deadline: Duration) -> Result<PgConnection, sqlx::Error> {
    let bound = format!("{}ms", deadline.as_millis().max(1));
    let options = (*pool.connect_options()).clone().options([
        ("plan_cache_mode", "force_generic_plan"),
        ("statement_timeout", bound.as_str()),
        ("lock_timeout", bound.as_str()),
    ]);
    let timeout = pool.options().get_acquire_timeout();
    tokio::time::timeout(timeout, options.connect()).await.map_err(|_| sqlx::Error::PoolTimedOut)?
}

/// The batcher's task: until every [`Batcher`] is dropped or the pool closes, takes what has
/// queued (at least one row, at most [`MAX_ROWS`]), sends it as one statement on a connection of
/// its own (beside the pool, as the engine's kept connections are), and answers each row.
async fn run<B: Batch>(
    batch: Arc<B>,
    pool: PgPool,
    deadline: Duration,
    in_flight: Arc<Mutex<Option<Instant>>>,
    mut rows: mpsc::UnboundedReceiver<Entry<B>>,
) {
    // The task's connection, and when it last answered.
    let mut connection: Option<(PgConnection, Instant)> = None;
    let mut entries = Vec::with_capacity(MAX_ROWS);
    loop {
        tokio::select! {
            received = rows.recv_many(&mut entries, MAX_ROWS) => if received == 0 { break },
            () = pool.close_event() => break,
        }
        let (sent, answers): (Vec<_>, Vec<_>) =
            entries.drain(..).map(|entry| ((entry.row, entry.fence), entry.answer)).unzip();
        *lock(&in_flight) = Some(Instant::now());
        // The connection first (a stale one checked, a new one made, each bounded), then the
        // batch, whose deadline counts from there: a slow reconnect does not eat it.
        let held = match connection.take() {
            Some((mut idle, answered)) if answered.elapsed() >= IDLE_RECHECK => {
                match tokio::time::timeout(deadline, idle.ping()).await {
                    Ok(Ok(())) => Ok(idle),
                    _ => connect(&pool, deadline).await,
                }
            }
            Some((kept, _)) => Ok(kept),
            None => connect(&pool, deadline).await,
        };
        // A connection whose statement failed, or that did not answer in time, is dropped (it
        // may be the failure); the next batch connects again.
        let written = match held {
            Ok(mut held) => {
                let sent_in_time =
                    tokio::time::timeout(deadline + ANSWER_GRACE, batch.send(&mut held, &sent));
                match sent_in_time.await {
                    Ok(Ok(written)) => {
                        connection = Some((held, Instant::now()));
                        Ok(written)
                    }
                    Ok(Err(err)) => Err(err),
                    Err(_) => {
                        tracing::warn!(
                            rows = answers.len(),
                            "a batch did not answer in time: its rows go alone"
                        );
                        Err(sqlx::Error::PoolTimedOut)
                    }
                }
            }
            Err(err) => Err(err),
        };
        *lock(&in_flight) = None;
        let written = match written {
            Ok(written) if written.len() == answers.len() => written,
            Ok(_) => {
                tracing::error!("a batch answered another number of rows than it carried");
                vec![None; answers.len()]
            }
            Err(err) => {
                // Expected now and then (a lost lease fails its batch): the rows going alone
                // report what concerns each.
                tracing::debug!(error = %err, rows = answers.len(), "a batch failed: its rows go alone");
                vec![None; answers.len()]
            }
        };
        for (answer, key_id) in answers.into_iter().zip(written) {
            let _ = answer.send(key_id);
        }
    }
    if let Some((connection, _)) = connection {
        let _ = connection.close().await;
    }
}
