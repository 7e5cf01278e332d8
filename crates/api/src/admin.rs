//! The admin listener: what operators and their scrapers read, on an address of its own
//! (`http.admin_host`, `http.admin_port`; `127.0.0.1:8081` by default), apart from the public
//! listener. It serves `GET /metrics` (Prometheus text), `GET /readyz` with its checks (the
//! database's state, the schema's versions, the migrations missing) and `GET /healthz`. The
//! public listener keeps only what a load balancer needs: `/healthz` and a `/readyz` that answers
//! by its status alone. Request rates per route, idempotency events and the schema's version say
//! a lot about a deployment to whoever may ask; only those who reach the admin address may.
//!
//! The listener is small and bounded: a connection's request line and headers must arrive within
//! [`HEADER_READ_TIMEOUT`], a request is answered within [`REQUEST_TIMEOUT`], and at most
//! [`MAX_CONNECTIONS`] are open at once (more wait in the kernel's backlog). It stops accepting
//! when the server stops; its answers are short, so nothing waits for them.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt as _;
use tower_http::timeout::TimeoutLayer;

use crate::app::AppState;
use crate::routes::health;

/// The longest a connection may take to send its request line and headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a request may take to be answered (a readiness check waits 2 s at most).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at most.
pub const MAX_CONNECTIONS: usize = 16;

/// The admin listener, bound, not yet serving.
#[derive(Debug)]
pub struct AdminListener {
    listener: TcpListener,
    router: Router,
}

impl AdminListener {
    /// Binds `http.admin_host:http.admin_port`, serving `state`.
    pub async fn bind(host: &str, port: u16, state: AppState) -> anyhow::Result<Self> {
        let address = format!("{host}:{port}");
        let listener = TcpListener::bind(&address).await.map_err(|err| {
            anyhow::anyhow!(
                "cannot listen on {address} (http.admin_host, http.admin_port) for /metrics: {err}"
            )
        })?;
        Ok(Self { listener, router: router(state) })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Serves until `stopping` turns true.
    pub async fn serve(self, mut stopping: watch::Receiver<bool>) {
        let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
        loop {
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                () = stopped(&mut stopping) => return,
            };
            let stream = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        tracing::warn!(error = %err, "the admin listener's accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = stopped(&mut stopping) => return,
            };
            let router = self.router.clone();
            let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
                router.clone().oneshot(request)
            });
            let connection = http.serve_connection(TokioIo::new(stream), service);
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    tracing::debug!(error = %err, "an admin connection ended with an error");
                }
                drop(permit);
            });
        }
    }
}

/// Completes once `stopping` turns true (no borrow of its value held across the accept).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stopping| *stopping).await;
}

/// `/metrics`, `/readyz` with its checks, `/healthz`; anything else is 404.
fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(crate::metrics::render))
        .route("/readyz", get(health::readyz_with_checks))
        .route("/healthz", get(health::healthz))
        .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, REQUEST_TIMEOUT))
        .with_state(state)
}
