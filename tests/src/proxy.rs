//! A TCP proxy in front of Postgres that a test can cut: `block` closes every open connection and
//! refuses new ones (the database "goes away"), `unblock` lets traffic through again. Started
//! with [`Proxy::recording`], it also reads what the clients send and records every statement the
//! server is asked to run, as the server receives it.

#![allow(clippy::expect_used)] // test support: a message the tap cannot read fails the test

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    blocked: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `target` on a free loopback port.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        Self::start_with(target, None).await
    }

    /// Starts a proxy to `target` that records, in order, the text of every statement its
    /// clients have the server run: each simple query (`BEGIN`, `COMMIT`) and each execution of
    /// a prepared statement. The clients must not use TLS (`sslmode=disable`).
    pub async fn recording(target: SocketAddr) -> std::io::Result<(Self, Recorded)> {
        let recorded = Recorded::default();
        Ok((Self::start_with(target, Some(recorded.clone())).await?, recorded))
    }

    async fn start_with(target: SocketAddr, recorded: Option<Recorded>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (blocked, blocked_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *blocked_rx.borrow() {
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, target, blocked_rx.clone(), recorded.clone()));
            }
        });
        Ok(Self { port, blocked, task })
    }

    /// The port to connect to instead of the target's.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts every open connection and refuses new ones.
    pub fn block(&self) {
        self.blocked.send_replace(true);
    }

    /// Lets connections through again.
    pub fn unblock(&self) {
        self.blocked.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    mut client: TcpStream,
    target: SocketAddr,
    mut blocked: watch::Receiver<bool>,
    recorded: Option<Recorded>,
) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let Some(recorded) = recorded else {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
            _ = blocked.wait_for(|blocked| *blocked) => {}
        }
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    // What the client sends is read before it is passed on: a statement is recorded before the
    // server can answer it.
    let upstream = async {
        let mut tap = Tap::default();
        let mut buffer = vec![0; 16 * 1024];
        loop {
            let read = from_client.read(&mut buffer).await?;
            if read == 0 {
                return to_server.shutdown().await;
            }
            tap.feed(&buffer[..read], &recorded);
            to_server.write_all(&buffer[..read]).await?;
        }
    };
    tokio::select! {
        _ = upstream => {}
        _ = tokio::io::copy(&mut from_server, &mut to_client) => {}
        _ = blocked.wait_for(|blocked| *blocked) => {}
    }
}

/// The statements a recording proxy's clients had the server run, in the order it got them, and
/// how many times a client checked a connection.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    statements: Arc<Mutex<Vec<String>>>,
    checks: Arc<AtomicUsize>,
}

impl Recorded {
    /// The statements recorded since the last call.
    pub fn take(&self) -> Vec<String> {
        let mut statements =
            self.statements.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::mem::take(&mut *statements)
    }

    /// The checks of a connection since the last call: a `Sync` with no other message since the
    /// connection's last `Sync` or simple query, a round trip that runs nothing (sqlx's `ping`,
    /// which its pool sends when a connection is given back).
    pub fn take_checks(&self) -> usize {
        self.checks.swap(0, Ordering::SeqCst)
    }

    fn push(&self, statement: String) {
        self.statements.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(statement);
    }
}

/// Reads one connection's frontend messages (the protocol's version 3): the startup packets,
/// then typed messages. A simple query (`Q`) is a statement; so is an execution (`E`) of a
/// portal, whose text is the prepared statement's (`P`) that the portal was bound to (`B`).
#[derive(Default)]
struct Tap {
    pending: Vec<u8>,
    started: bool,
    statements: HashMap<String, String>,
    portals: HashMap<String, String>,
    /// Whether the client sent a message since its last `Sync` or simple query.
    since_sync: bool,
}

/// The request codes of the packets that may come before the startup message.
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;

impl Tap {
    fn feed(&mut self, bytes: &[u8], recorded: &Recorded) {
        self.pending.extend_from_slice(bytes);
        loop {
            let (header, typed) = if self.started { (5, true) } else { (8, false) };
            if self.pending.len() < header {
                return;
            }
            let at = usize::from(typed);
            let length = u32::from_be_bytes(
                self.pending[at..at + 4].try_into().expect("four bytes make a message length"),
            );
            let total = at + length as usize;
            if self.pending.len() < total {
                return;
            }
            let message: Vec<u8> = self.pending.drain(..total).collect();
            if !typed {
                let code = u32::from_be_bytes(
                    message[4..8].try_into().expect("four bytes make a request code"),
                );
                self.started = code != SSL_REQUEST && code != GSS_REQUEST;
                continue;
            }
            let mut fields = message[5..].split(|byte| *byte == 0).map(String::from_utf8_lossy);
            let mut next = || {
                fields.next().map(|field| field.into_owned()).expect("a message names its fields")
            };
            let kind = message[0];
            match kind {
                b'Q' => recorded.push(next()),
                b'S' if !self.since_sync => {
                    recorded.checks.fetch_add(1, Ordering::SeqCst);
                }
                b'P' => {
                    let name = next();
                    self.statements.insert(name, next());
                }
                b'B' => {
                    let portal = next();
                    let text = self.statements.get(&next()).cloned();
                    let text = text.expect("a portal is bound to a statement the client parsed");
                    self.portals.insert(portal, text);
                }
                b'E' => {
                    let text = self.portals.get(&next()).cloned();
                    recorded.push(text.expect("an execution names a portal the client bound"));
                }
                _ => {}
            }
            // A simple query or a `Sync` ends what the server answers at once.
            self.since_sync = !matches!(kind, b'S' | b'Q');
        }
    }
}
