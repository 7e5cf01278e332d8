//! What the stand-in's `/_sim` surface asks of the books: to forget everything, or one account's
//! objects and kept keys (`POST /_sim/reset`), and the clock (`/_sim/clock`).
//!
//! A new kind of object joins [`Ledger::forget_account`] (kept unless its account is the one
//! forgotten) and [`Removed`] (counted), or a reset of one account would leave it behind.

use serde::Serialize;

use super::{Ledger, MetadataIndex};
use crate::clock::Clock;

/// How many of each thing a reset forgot, as `POST /_sim/reset` answers it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Removed {
    /// Charge objects.
    pub charges: usize,
    /// Refund objects (those of a forgotten charge included, whoever made them).
    pub refunds: usize,
    /// PaymentIntent objects (with their pending authentications).
    pub payment_intents: usize,
    /// Kept idempotency results.
    pub idempotency_keys: usize,
}

impl Removed {
    /// What `before` holds that `after` does not.
    fn between(before: Self, after: Self) -> Self {
        Self {
            charges: before.charges.saturating_sub(after.charges),
            refunds: before.refunds.saturating_sub(after.refunds),
            payment_intents: before.payment_intents.saturating_sub(after.payment_intents),
            idempotency_keys: before.idempotency_keys.saturating_sub(after.idempotency_keys),
        }
    }
}

impl Ledger {
    /// The clock the books read.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The clock, to move it forward.
    pub(crate) fn clock_mut(&mut self) -> &mut Clock {
        &mut self.clock
    }

    /// What the books hold, counted as a reset counts what it forgot.
    fn holdings(&self) -> Removed {
        Removed {
            charges: self.charges.len(),
            refunds: self.refunds.len(),
            payment_intents: self.intents.len(),
            idempotency_keys: self.keys.len(),
        }
    }

    /// Forgets every object (PaymentIntents and their pending authentications included), every
    /// kept key and the counters, and takes back every advance of the clock: the books are as at
    /// start-up.
    pub(crate) fn forget_everything(&mut self) -> Removed {
        let removed = self.holdings();
        let mut clock = self.clock.clone();
        clock.clear_offset();
        *self = Self::new(clock);
        removed
    }

    /// Forgets the objects made with the secret key `api_key` (charges, refunds, PaymentIntents
    /// with their pending authentications), and its kept idempotency keys; every other
    /// account's are kept, as are the counters and the clock. The indexes are built again from
    /// what is kept: a reset is rare beside the requests it serves.
    pub(crate) fn forget_account(&mut self, api_key: &str) -> Removed {
        let before = self.holdings();
        let charges = std::mem::take(&mut self.charges);
        let refunds = std::mem::take(&mut self.refunds);
        self.charge_index.clear();
        self.metadata_index = MetadataIndex::default();
        self.refunds_by_charge.clear();
        for charge in charges.into_iter().filter(|charge| &*charge.account != api_key) {
            let position = self.charges.len();
            for (key, value) in &charge.metadata {
                self.metadata_index.add(key, value, position);
            }
            self.charge_index.insert(charge.id.clone(), position);
            self.charges.push(charge);
        }
        for refund in refunds.into_iter().filter(|refund| &*refund.account != api_key) {
            // A refund of a forgotten charge goes with it: there is nothing left to refund.
            let Some(&position) = self.charge_index.get(&refund.charge) else { continue };
            self.refunds_by_charge.entry(position).or_default().push(self.refunds.len());
            self.refunds.push(refund);
        }
        // The charges made under a forgotten intent are its key's too, so went above.
        self.intents.forget_account(api_key);
        self.keys.forget_account(api_key);
        Removed::between(before, self.holdings())
    }
}
