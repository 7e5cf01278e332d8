//! A key's state diagram as inline SVG, drawn on the server: its operation's recovery points in
//! order, then `finished`, and `flagged` (needs a person) beside them; the points this key passed
//! and the edges it took drawn thick and marked "✓ passed", where it stands now framed twice and
//! marked "▶ now" with its lease. Every state is told in words too (text in the boxes, a `<title>`
//! and a `<desc>`), never by colour alone. A new payment's key may finish with a payment that
//! `requires_action` (3-D Secure), whose outcome is recorded after the key is finished: its
//! `finished` box says so ([`Waiting`]).
//!
//! Here: what the diagram is drawn from (each operation's [`Shape`], a key's [`KeyPath`] and where
//! it stands, [`Now`]). The drawing is in `svg`.

mod svg;

pub use svg::state_diagram;

use payments_domain::operations::{
    CANCEL_PAYMENT, CAPTURE_PAYMENT, CREATE_ENDPOINT, CREATE_PAYMENT, CREATE_REFUND,
    UPDATE_ENDPOINT, UPDATE_PAYMENT,
};

/// One operation as the diagram draws it. The recovery points are the operation's own
/// (`recovery_points!` in `payments_domain::operations`); a test holds the two
/// together.
#[derive(Debug)]
pub struct Shape {
    /// The operation's stored name (`idempotency_keys.operation`).
    pub operation: &'static str,
    /// Its recovery points in order, `started` first, each with the audit action that the phase
    /// moving a key there records (how a finished key shows it passed the point).
    pub points: &'static [(&'static str, &'static str)],
    /// Its first phase can store an answer at once (a refusal), skipping the later points.
    pub first_phase_may_finish: bool,
    /// Its section of `docs/operations.md`.
    pub guide_anchor: &'static str,
}

/// Every operation that runs under an idempotency key.
pub const SHAPES: &[Shape] = &[
    Shape {
        operation: CREATE_PAYMENT,
        points: &[("started", ""), ("payment_created", "payment.created")],
        first_phase_may_finish: false,
        guide_anchor: "create-a-payment",
    },
    Shape {
        operation: CAPTURE_PAYMENT,
        points: &[("started", ""), ("capture_started", "payment.capture_started")],
        first_phase_may_finish: true,
        guide_anchor: "capture-a-payment",
    },
    Shape {
        operation: CANCEL_PAYMENT,
        points: &[("started", ""), ("cancel_started", "payment.cancel_started")],
        first_phase_may_finish: true,
        guide_anchor: "cancel-a-payment",
    },
    Shape {
        operation: CREATE_REFUND,
        points: &[("started", ""), ("refund_created", "refund.created")],
        first_phase_may_finish: true,
        guide_anchor: "refund-a-payment",
    },
    Shape {
        operation: UPDATE_PAYMENT,
        points: &[("started", "")],
        first_phase_may_finish: true,
        guide_anchor: "the-keys-state-machine",
    },
    Shape {
        operation: CREATE_ENDPOINT,
        points: &[("started", "")],
        first_phase_may_finish: true,
        guide_anchor: "the-keys-state-machine",
    },
    Shape {
        operation: UPDATE_ENDPOINT,
        points: &[("started", "")],
        first_phase_may_finish: true,
        guide_anchor: "the-keys-state-machine",
    },
];

/// The shape of operation `name`, if it is one of ours.
pub fn shape(name: &str) -> Option<&'static Shape> {
    SHAPES.iter().find(|shape| shape.operation == name)
}

/// Where a key stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Now {
    /// At its recovery point, a process holding the lease.
    LeaseHeld,
    /// At its recovery point, the holder's lease run out (it died or stalled).
    LeaseExpired,
    /// Released at its recovery point after a transient failure.
    LeaseFree,
    /// Its answer stored.
    Finished,
    /// Flagged for a person at its recovery point.
    Flagged,
}

impl Now {
    /// The words the diagram and the legend use.
    pub fn words(self) -> &'static str {
        match self {
            Self::LeaseHeld => "lease held (in flight)",
            Self::LeaseExpired => "lease expired",
            Self::LeaseFree => "lease free (released)",
            Self::Finished => "finished (answer stored)",
            Self::Flagged => "flagged (needs a person)",
        }
    }
}

pub use payments_domain::authentication::{REQUIRES_ACTION, SETTLED};

/// Whether a key's payment waited on its customer after the key was finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The key's answer is a payment that `requires_action`, and no outcome is recorded yet.
    ForItsCustomer,
    /// It was, and its outcome has been recorded since (by webhook or by the worker's look).
    Settled,
}

impl Waiting {
    /// What the audit records written under a key say, if its payment waited on its customer.
    pub fn of(actions: &[&str]) -> Option<Self> {
        if !actions.contains(&REQUIRES_ACTION) {
            None
        } else if actions.contains(&SETTLED) {
            Some(Self::Settled)
        } else {
            Some(Self::ForItsCustomer)
        }
    }

    /// The words the diagram's `finished` box uses.
    pub fn words(self) -> &'static str {
        match self {
            Self::ForItsCustomer => "payment: requires_action",
            Self::Settled => "payment: settled later",
        }
    }
}

/// What the diagram is drawn from: the key's row, its attempts and its audit records.
#[derive(Debug, Clone)]
pub struct KeyPath<'a> {
    /// The operation's stored name.
    pub operation: &'a str,
    /// The key's `recovery_point`.
    pub recovery_point: &'a str,
    /// Where it stands.
    pub now: Now,
    /// The recovery point each attempt after the claim started from.
    pub resumed_from: Vec<&'a str>,
    /// The actions of the audit records written under the key.
    pub actions: Vec<&'a str>,
}

#[cfg(test)]
mod tests;
