//! The routes, one module per resource.

pub mod health;
pub mod payments;
pub mod problems;
pub mod refunds;
