//! The application: state, router, listener, and graceful shutdown.
//!
//! `Application::build` binds the listener (port 0 picks a free port, which the tests use) and
//! returns before serving, so a caller can read `port()` first; `run_until_stopped` serves until
//! SIGTERM or Ctrl-C and then lets requests in flight finish, up to the configured grace. What is
//! still running at the end of the grace gives its keys back at their recovery points, so that a
//! retry on the next process resumes at once instead of answering `409` until the lease expires.
//!
//! The accept loop is hyper's own connection builder rather than `axum::serve`, which runs
//! without a timer: here every connection has a header-read timeout, a shorter idle timeout after
//! an answer (`idle_timeout`: a kept-alive connection the client does not use is closed before a
//! slow request's headers would be), a write timeout (`write_timeout`: a client that stops reading
//! its answers is dropped instead of holding its connection for ever), the number of open connections is bounded, in all and per
//! source (`limits::SourceConnections`: one host cannot take every place), and each request
//! knows its peer's address (`ConnectInfo`), from which the edge tells its client's
//! (`limits::ClientAddress`) for the per-address limit.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, OriginalUri};
use axum::http::Method;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use idem::Engine;
use payments_domain::authentication::AuthenticationSettings;
use payments_domain::operations::Context;
use payments_domain::webhooks::SealingKeys;
use provider::ProcessorClient;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use utoipa::openapi::OpenApi;
use utoipa_axum::routes;

use crate::admin::AdminListener;
use crate::edge::{self, EdgeConfig, EdgeLimits};
use crate::error::{ApiError, ProblemCode};
use crate::idempotency::Runner;
use crate::idle_timeout::IdleTimeout;
use crate::limits::{ProxyTrust, SourceConnections, SourceKey};
use crate::openapi::ApiRouter;
use crate::routes::{
    events, health, payments, problems, processor_webhooks, refunds, webhook_endpoints,
};
use crate::settings::Settings;
use crate::write_timeout::{WriteStalled, WriteTimeout};

/// What every handler can reach. axum clones it for every request and extractor, so it is one
/// shared pointer (`Services` behind an `Arc`), not a struct of them.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Services>);

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// The pool, the settings and the rest, shared by all requests.
#[derive(Debug)]
pub struct Services {
    /// The Postgres pool.
    pub pool: PgPool,
    /// The settings the process started with.
    pub settings: Arc<Settings>,
    /// Runs idempotent operations.
    pub runner: Runner,
    /// What the payment operations need: the pool, the processor, the public base URL.
    pub operations: Context<ProcessorClient>,
    /// Request rates per account, and per client address of lookups of keys not known to be live.
    pub limits: crate::limits::Limits,
    /// The accounts of the API keys seen lately.
    pub known_keys: Arc<crate::auth::KnownKeys>,
    /// API keys found unknown lately, answered 401 without a lookup.
    pub unknown_keys: crate::auth::UnknownKeys,
    /// The OpenAPI document, rendered once.
    pub openapi: axum::body::Bytes,
    /// Places for processor webhooks whose bodies are read and verified
    /// (`processor.webhook_max_unverified`): they wait outside the edge's in-flight bound, whose
    /// places are for callers known to be who they say.
    pub unverified_webhooks: Semaphore,
    /// Readiness probes, which share the check in progress (`/readyz`).
    pub readiness: crate::routes::health::Readiness,
    /// Wrong operator tokens the inspector heard, per source and in all.
    pub inspector_guesses: crate::inspector::Guesses,
}

/// A bound, not yet serving, API server.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    /// `/metrics` and the detailed readiness, on an address of their own.
    admin: AdminListener,
    router: Router,
    /// The listener's bounds: connections, their timeouts, the shutdown's grace.
    http: payments_settings::HttpSettings,
    /// Open connections per source; a trusted proxy is not held to it.
    source_connections: SourceConnections,
    /// Which peers are trusted proxies.
    proxies: Arc<ProxyTrust>,
    /// Operations that outlive their requests; shutdown waits for them.
    tasks: TaskTracker,
    /// The engine, whose leases still held at the end of the grace are released.
    engine: Engine,
}

impl Application {
    /// Binds the listener and connects the pool lazily (the server starts even while the database
    /// is away, and `/readyz` says so).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let pool = pool(&settings)?;
        Self::build_with_pool(settings, pool).await
    }

    /// Like `build`, with a pool the caller made (tests use one per test database).
    pub async fn build_with_pool(settings: Settings, pool: PgPool) -> anyhow::Result<Self> {
        let address = format!("{}:{}", settings.http.host, settings.http.port);
        let listener = TcpListener::bind(&address).await.map_err(|err| {
            anyhow::anyhow!("cannot listen on {address} (http.host, http.port): {err}")
        })?;
        let port = listener.local_addr()?.port();
        let edge = EdgeConfig {
            public_base_url: settings.public_base_url(port).into(),
            body_limit_bytes: settings.http.body_limit_bytes,
            limits: EdgeLimits {
                body_timeout: Duration::from_millis(settings.http.body_timeout_ms),
                request_timeout: Duration::from_millis(settings.http.request_timeout_ms),
                in_flight: Arc::new(Semaphore::new(settings.http.max_in_flight_requests as usize)),
                body_deadline: Duration::from_millis(settings.http.body_deadline_ms),
            },
            proxies: Arc::new(ProxyTrust::new(
                settings.http.trusted_proxies.clone(),
                settings.http.forwarded_header,
            )),
        };
        let source_connections = SourceConnections::new(settings.http.max_connections_per_source);
        let proxies = edge.proxies.clone();
        // Install the metrics recorder before anything records.
        let _ = payments_telemetry::metrics();
        let tasks = TaskTracker::new();
        let engine = Engine::new(
            pool.clone(),
            settings.engine_config(),
            Arc::new(crate::metrics::IdemMetrics),
        );
        let runner = Runner::new(engine.clone(), tasks.clone());
        let processor = ProcessorClient::new(settings.processor.client_config())?;
        let keys = settings.sealing_keys()?;
        let sealing_keys = Arc::new(SealingKeys::new(keys.current.0, keys.old.iter().map(|k| k.0)));
        tracing::info!(key = %sealing_keys.current_id(), "webhook signing secrets sealed");
        let operations = Context::new(
            pool.clone(),
            Arc::new(processor),
            edge.public_base_url.clone(),
            sealing_keys,
        )
        .with_charge_metadata(settings.processor.charge_metadata.clone())
        .with_authentication(AuthenticationSettings::configured(
            settings.processor.return_url(&edge.public_base_url),
            settings.processor.authentication_check_after(),
            settings.processor.authentication_expires_after(),
        ))
        .with_batches(settings.idempotency.batch_phases)
        .with_fast_path(settings.idempotency.fast_path);
        let limits = crate::limits::Limits::new(&settings.rate_limit);
        // Ends once the state, and with it the limits, is dropped.
        limits.prune_every(crate::limits::PRUNE_PERIOD);
        let unknown_keys = crate::auth::UnknownKeys::new(Duration::from_millis(
            settings.rate_limit.unknown_key_cache_ms,
        ));
        let unverified_webhooks =
            Semaphore::new(settings.processor.webhook_max_unverified as usize);
        let (api, paths) = api();
        let openapi = crate::openapi::json(paths, &settings, &edge.public_base_url).into();
        let state = AppState(Arc::new(Services {
            pool,
            settings: Arc::new(settings),
            runner,
            operations,
            limits,
            known_keys: Arc::default(),
            unknown_keys,
            openapi,
            unverified_webhooks,
            readiness: Default::default(),
            inspector_guesses: Default::default(),
        }));
        let (admin_host, admin_port) =
            (&state.settings.http.admin_host, state.settings.http.admin_port);
        let admin = AdminListener::bind(admin_host, admin_port, state.clone()).await?;
        let state_http = state.settings.http.clone();
        let router = edge::wrap(router(api, state), edge);
        Ok(Self {
            listener,
            admin,
            router,
            http: state_http,
            source_connections,
            proxies,
            tasks,
            engine,
        })
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The port of the admin listener (`/metrics`, the detailed readiness).
    pub fn admin_port(&self) -> u16 {
        self.admin.port()
    }

    /// Serves until SIGTERM or Ctrl-C.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `stop` completes, then drains requests in flight for up to the grace period.
    pub async fn run_until(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stopping_tx, mut stopping_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            stop.await;
            let _ = stopping_tx.send(true);
        });
        tokio::spawn(self.admin.serve(stopping_rx.clone()));
        let graceful = GracefulShutdown::new();
        let millis = Duration::from_millis;
        let connections = Arc::new(Semaphore::new(self.http.max_connections as usize));
        let timer = TokioTimer::new();
        let mut http = http1::Builder::new();
        http.timer(timer.clone())
            .header_read_timeout(millis(self.http.header_read_timeout_ms))
            .max_header_size(usize::try_from(self.http.max_header_bytes).unwrap_or(usize::MAX));
        let mut accept_rx = stopping_rx.clone();
        loop {
            // At the bound, new connections wait in the kernel's backlog, not in memory here.
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => permit?,
                () = stopping(&mut accept_rx) => break,
            };
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors, or a connection reset while queued: wait a
                        // moment rather than spin, and keep serving.
                        tracing::warn!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = stopping(&mut accept_rx) => break,
            };
            // Beyond its source's bound a connection is closed at once, before it is read.
            let place = if self.proxies.trusts(peer.ip()) {
                None
            } else {
                let Some(place) = self.source_connections.open(SourceKey::of(peer.ip())) else {
                    metrics::counter!("http_source_connections_refused_total").increment(1);
                    tracing::debug!(%peer, "connection refused: its source holds as many as it may");
                    continue;
                };
                Some(place)
            };
            let _ = stream.set_nodelay(true);
            // hyper's own timer covers only the reading of headers; a write that waits on a
            // client that stopped reading must end too.
            let write_timeout = millis(self.http.write_timeout_ms);
            let stream = WriteTimeout::new(stream, write_timeout, timer.clone());
            // And a connection kept alive after an answer may sit idle for less than a request
            // may take to send its headers.
            let stream = IdleTimeout::new(stream, millis(self.http.idle_timeout_ms), timer.clone());
            let router = self.router.clone();
            let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                router.clone().oneshot(request)
            });
            let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    // A client that stalled, hung up or spoke garbage: its problem, not ours.
                    if WriteStalled::caused(&err) {
                        metrics::counter!("http_write_stalled_connections_total").increment(1);
                        tracing::debug!(
                            %peer,
                            "connection closed: the client stopped reading its answers"
                        );
                    } else {
                        tracing::debug!(error = %err, %peer, "connection ended with an error");
                    }
                }
                drop(permit);
                drop(place);
            });
        }
        tracing::info!("shutting down: no new connections, finishing requests in flight");
        drop(self.listener);
        let grace = millis(self.http.shutdown_grace_ms);
        let tasks = self.tasks;
        let engine = self.engine;
        let drained = async move {
            graceful.shutdown().await;
            // Operations whose clients hung up still run; let them reach a recovery point.
            tasks.close();
            tasks.wait().await;
            Ok::<(), std::io::Error>(())
        };
        tokio::select! {
            drained = drained => drained?,
            () = async {
                let _ = stopping_rx.wait_for(|stopping| *stopping).await;
                tokio::time::sleep(grace).await;
            } => {
                // The tasks stop with the process; their keys must not wait for the lease.
                let released = engine
                    .release_held("the server stopped before the operation reached its end")
                    .await;
                tracing::warn!(grace_ms = grace.as_millis() as u64, released, "work still in flight after the shutdown grace; its keys were released at their recovery points");
            }
        }
        Ok(())
    }
}

/// Completes once `stop` says so (a helper, so that no borrow of the channel's value is held in
/// the accept loop's future).
async fn stopping(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopping| *stopping).await;
}

/// The pool the settings describe, connecting lazily.
pub fn pool(settings: &Settings) -> anyhow::Result<PgPool> {
    Ok(settings.database.pool()?)
}

/// The API's routes and, made by the same calls, the paths of its OpenAPI document: a route is
/// added only with its handler's `#[utoipa::path]` (`ApiRouter`). Each module of `routes` adds
/// its own, next to its handlers.
pub fn api() -> (Router<AppState>, OpenApi) {
    ApiRouter::default()
        .with(health::routes)
        .routes(routes!(crate::openapi::serve))
        .with(problems::routes)
        .with(payments::routes)
        .with(refunds::routes)
        .with(events::routes)
        .with(webhook_endpoints::routes)
        .with(processor_webhooks::routes)
        .split()
}

/// The API's routes (`api`), the inspector's, and what every request passes through.
fn router(api: Router<AppState>, state: AppState) -> Router {
    // The operator's page is not part of the API (nor of its OpenAPI document), and off by default.
    let routes =
        if state.settings.inspector.enabled { api.merge(crate::inspector::router()) } else { api };
    routes
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::limit_anonymous,
        ))
        .route_layer(axum::middleware::from_fn(crate::metrics::track))
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn unknown_route(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::resource_missing(format!("Unrecognized request URL ({method}: {}).", uri.path()))
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::new(
        ProblemCode::MethodNotAllowed,
        format!("{} does not accept {method}.", uri.path()),
    )
}

/// Completes on SIGTERM or Ctrl-C.
pub use payments_telemetry::shutdown_signal;
