//! The payments HTTP API.
//!
//! A request flows: `edge` (request id, size check, span, panic recovery, problem rendering) →
//! the router → an extractor chain (`auth::Authenticated`, `extract::ApiQuery`/`JsonBody`) → a
//! handler in `routes`, which calls into `payments_domain`. Every error is an `error::ApiError`.
//! `/metrics` and the detailed readiness are on a listener of their own (`admin`).

pub mod admin;
pub mod app;
pub mod auth;
pub mod cli;
pub mod edge;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod idle_timeout;
pub mod inspector;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod routes;
pub mod write_timeout;
pub use payments_settings as settings;
pub use payments_telemetry as telemetry;

pub use app::{AppState, Application, Services};
pub use error::{ApiError, ProblemCode};
pub use settings::Settings;

/// The schema migrations, embedded so that `payments-api migrate` needs no files at run time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");
