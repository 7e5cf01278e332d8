//! The fast path, beside the reference road: an operation may send a phase as **one statement**
//! instead of a transaction ([`one_statement`]), and its first phase may **claim its key** in
//! that same statement ([`first_statement`]). Each saves round trips on the hot path (a new
//! payment costs two statements in all); neither changes what is written. A reader learning the
//! design can skip this folder: [`Lease::begin`](super::Lease::begin) and the commits of a
//! [`FencedTx`](super::FencedTx) are the whole of it.

pub(super) mod first_statement;
pub(super) mod one_statement;

pub use first_statement::{ClaimArgs, First};
pub use one_statement::ONE_STATEMENT_TIMEOUT;
