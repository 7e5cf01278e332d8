//! Claim lanes: a few connections the engine keeps for the claim statement alone.
//!
//! sqlx's pool checks every connection with a round trip when it is given back, and cannot be
//! told not to: it cannot know whether the statement that used it ran to its end, or was cut off
//! by a future dropped halfway (a client hanging up). For the claim, one statement and the whole
//! of a replay, that check was the largest cost left between the API and the database's own floor
//! (BENCHMARKS.md). A lane is a task that owns one connection and runs claims one after the other;
//! a request hands its claim over and waits for the answer. A request that goes away cannot cut
//! the statement off (the lane runs it to its end), so the connection never needs checking.
//!
//! A lane connects on its first claim (giving up after the pool's acquire timeout, as a request
//! waiting for a pooled connection would), runs each claim in the requester's span, replaces a
//! connection the server dropped, and closes its connection when the pool is closed.
//!
//! Every wait is bounded, so that one key whose row a stuck transaction holds cannot take the
//! lanes, and every other account's claims queued behind them, for ever: a claim waits for a lane
//! at most the pool's acquire timeout (as it would for a pooled connection), and the lane's
//! session has `lock_timeout` and `statement_timeout` set to the claim timeout. A claim that
//! times out fails with nothing stored (the statement rolled back, or never ran).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::Instrument as _;

use crate::error::IdemError;
use crate::kept::connection_lost;
use crate::store::{self, Lookup, Seen};

/// Claims waiting for a lane, at most; a request beyond them waits to hand its claim over.
const QUEUE: usize = 1024;

struct Job {
    lookup: Lookup,
    span: tracing::Span,
    /// When the claim started waiting for a lane.
    queued: Instant,
    answer: oneshot::Sender<Result<Seen, IdemError>>,
}

/// The lanes of one engine.
#[derive(Debug)]
pub(crate) struct Lanes {
    jobs: mpsc::Sender<Job>,
    /// The longest a claim waits for a lane: the pool's acquire timeout.
    queue_timeout: Duration,
}

impl Lanes {
    /// Starts `count` lanes connecting with the pool's options, each session's statements and
    /// lock waits bounded by `claim_timeout`; they stop when the pool closes. Must be called
    /// within a Tokio runtime.
    pub(crate) fn start(pool: &PgPool, count: usize, claim_timeout: Duration) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        let queue_timeout = pool.options().get_acquire_timeout();
        let bound = format!("{}ms", claim_timeout.as_millis().max(1));
        let options =
            Arc::new((*pool.connect_options()).clone().options([
                ("lock_timeout", bound.as_str()),
                ("statement_timeout", bound.as_str()),
            ]));
        for _ in 0..count {
            let (queue, pool, options) = (queue.clone(), pool.clone(), options.clone());
            tokio::spawn(async move {
                let connect = Connect { options, timeout: queue_timeout, queue_timeout };
                tokio::select! {
                    () = lane(&queue, &connect) => {}
                    () = pool.close_event() => {}
                }
            });
        }
        Self { jobs, queue_timeout }
    }

    /// Runs the claim's read on a lane. Fails with `PoolTimedOut` when no lane took it within
    /// the pool's acquire timeout; the statement itself is bounded by the lane's session.
    pub(crate) async fn read(&self, lookup: Lookup) -> Result<Seen, IdemError> {
        let (answer, answered) = oneshot::channel();
        let job = Job { lookup, span: tracing::Span::current(), queued: Instant::now(), answer };
        match tokio::time::timeout(self.queue_timeout, self.jobs.send(job)).await {
            Ok(sent) => sent.map_err(|_| closed())?,
            Err(_) => return Err(IdemError::Database(sqlx::Error::PoolTimedOut)),
        }
        // Not bounded here: a lane that took the claim runs it to its end (bounded by the
        // session's timeouts), and its answer is waited for.
        answered.await.map_err(|_| closed())?
    }
}

fn closed() -> IdemError {
    IdemError::Database(sqlx::Error::PoolClosed)
}

/// How a lane connects.
struct Connect {
    options: Arc<PgConnectOptions>,
    timeout: Duration,
    /// The longest a claim may have waited for a lane and still be run.
    queue_timeout: Duration,
}

impl Connect {
    async fn connect(&self) -> Result<PgConnection, sqlx::Error> {
        tokio::time::timeout(self.timeout, self.options.connect())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
    }
}

/// One lane: takes the next claim, runs it, answers; until the queue closes.
async fn lane(queue: &Mutex<mpsc::Receiver<Job>>, connect: &Connect) {
    let mut connection: Option<PgConnection> = None;
    loop {
        let Some(job) = queue.lock().await.recv().await else { break };
        if job.answer.is_closed() {
            // The request went away before its claim started: nothing to run.
            continue;
        }
        if job.queued.elapsed() > connect.queue_timeout {
            // Queued behind lanes that were held up: give up as a pool acquire would, running
            // nothing, so that the queue drains instead of growing without a deadline.
            let _ = job.answer.send(Err(IdemError::Database(sqlx::Error::PoolTimedOut)));
            continue;
        }
        let result = run(&mut connection, connect, &job.lookup).instrument(job.span).await;
        let _ = job.answer.send(result);
    }
    if let Some(connection) = connection {
        let _ = connection.close().await;
    }
}

/// Runs one claim on the lane's connection, connecting first if it has none. A connection that
/// had been open fails like this after a database restart; the claim is then sent once more on
/// a fresh one. That is safe: the statement only reads (the id it may reserve from the sequence is
/// simply not used).
async fn run(
    connection: &mut Option<PgConnection>,
    connect: &Connect,
    lookup: &Lookup,
) -> Result<Seen, IdemError> {
    let reused = connection.is_some();
    match run_once(connection, connect, lookup).await {
        Err(err) if reused && connection.is_none() => {
            tracing::debug!(error = %err, "a claim lane's connection failed; connecting again");
            run_once(connection, connect, lookup).await
        }
        result => result,
    }
}

/// One try; a connection that is lost is dropped.
async fn run_once(
    connection: &mut Option<PgConnection>,
    connect: &Connect,
    lookup: &Lookup,
) -> Result<Seen, IdemError> {
    let conn = match connection {
        Some(conn) => conn,
        None => connection.insert(connect.connect().await?),
    };
    let result = store::read(&mut *conn, lookup).await;
    if let Err(IdemError::Database(err)) = &result
        && connection_lost(err)
    {
        *connection = None;
    }
    result
}
