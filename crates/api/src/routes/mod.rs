//! The routes, one module per resource.

pub mod events;
pub mod health;
pub mod lists;
pub mod payments;
pub mod problems;
pub mod processor_webhooks;
pub mod refunds;
pub mod webhook_endpoints;
