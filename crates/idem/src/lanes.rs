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

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::error::IdemError;
use crate::store::{self, NewKey, Seen};

/// Claims waiting for a lane, at most; a request beyond them waits to hand its claim over.
const QUEUE: usize = 1024;

/// The owned form of [`NewKey`]: a claim outlives the request that made it.
#[derive(Debug, Clone)]
pub(crate) struct OwnedNewKey {
    pub account_id: String,
    pub credential: Option<Vec<u8>>,
    pub key: String,
    pub fingerprint: Vec<u8>,
    pub method: String,
    pub path: String,
    pub request_id: String,
    pub operation: String,
    pub params: Value,
    pub token: Uuid,
    pub lease_ms: i64,
}

impl OwnedNewKey {
    pub(crate) fn borrowed(&self) -> NewKey<'_> {
        NewKey {
            account_id: &self.account_id,
            credential: self.credential.as_deref(),
            key: &self.key,
            fingerprint: &self.fingerprint,
            method: &self.method,
            path: &self.path,
            request_id: &self.request_id,
            operation: &self.operation,
            params: &self.params,
            token: self.token,
            lease_ms: self.lease_ms,
        }
    }
}

struct Job {
    new: OwnedNewKey,
    span: tracing::Span,
    answer: oneshot::Sender<Result<Seen, IdemError>>,
}

/// The lanes of one engine.
#[derive(Debug)]
pub(crate) struct Lanes {
    jobs: mpsc::Sender<Job>,
}

impl Lanes {
    /// Starts `count` lanes connecting with the pool's options; they stop when the pool closes.
    /// Must be called within a Tokio runtime.
    pub(crate) fn start(pool: &PgPool, count: usize) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..count {
            let (queue, pool) = (queue.clone(), pool.clone());
            tokio::spawn(async move {
                let connect = Connect {
                    options: pool.connect_options(),
                    timeout: pool.options().get_acquire_timeout(),
                };
                tokio::select! {
                    () = lane(&queue, &connect) => {}
                    () = pool.close_event() => {}
                }
            });
        }
        Self { jobs }
    }

    /// Runs the claim statement on a lane.
    pub(crate) async fn claim(&self, new: OwnedNewKey) -> Result<Seen, IdemError> {
        let (answer, answered) = oneshot::channel();
        let job = Job { new, span: tracing::Span::current(), answer };
        self.jobs.send(job).await.map_err(|_| closed())?;
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
        let result = run(&mut connection, connect, &job.new).instrument(job.span).await;
        let _ = job.answer.send(result);
    }
    if let Some(connection) = connection {
        let _ = connection.close().await;
    }
}

/// Runs one claim on the lane's connection, connecting first if it has none. A connection that
/// had been open fails like this after a database restart; the claim is then sent once more on
/// a fresh one. That is safe: sent twice, the statement reads the row its first run inserted, and
/// the engine recognises its own lease by its token.
async fn run(
    connection: &mut Option<PgConnection>,
    connect: &Connect,
    new: &OwnedNewKey,
) -> Result<Seen, IdemError> {
    let reused = connection.is_some();
    match run_once(connection, connect, new).await {
        Err(err) if reused && connection.is_none() => {
            tracing::debug!(error = %err, "a claim lane's connection failed; connecting again");
            run_once(connection, connect, new).await
        }
        result => result,
    }
}

/// One try; a connection that is lost is dropped.
async fn run_once(
    connection: &mut Option<PgConnection>,
    connect: &Connect,
    new: &OwnedNewKey,
) -> Result<Seen, IdemError> {
    let conn = match connection {
        Some(conn) => conn,
        None => connection.insert(connect.connect().await?),
    };
    let result = store::insert_or_read(&mut *conn, &new.borrowed()).await;
    if let Err(IdemError::Database(err)) = &result
        && connection_lost(err)
    {
        *connection = None;
    }
    result
}

/// A failure of the connection rather than of the statement: no answer at all (I/O, protocol),
/// or the server ending the session (SQLSTATE class 08, connection exception, or 57P, the
/// server shutting down or terminating the backend).
fn connection_lost(err: &sqlx::Error) -> bool {
    match err.as_database_error().and_then(|db| db.code()) {
        Some(code) => code.starts_with("08") || code.starts_with("57P"),
        None => err.as_database_error().is_none(),
    }
}
