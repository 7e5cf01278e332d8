//! A TCP proxy in front of Postgres that a test can cut: `block` closes every open connection and
//! refuses new ones (the database "goes away"), `unblock` lets traffic through again.

use std::net::SocketAddr;

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
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (blocked, blocked_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *blocked_rx.borrow() {
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, target, blocked_rx.clone()));
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

async fn relay(mut client: TcpStream, target: SocketAddr, mut blocked: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = blocked.wait_for(|blocked| *blocked) => {}
    }
}
