//! Stripe's lists, newest first and a page at a time: `GET /v1/charges` and `GET /v1/refunds`
//! (all refunds, or one charge's). Only the page is serialized, so a page costs the same however
//! many objects there are.

use serde_json::{Value, json};

use super::{ChargeRecord, Ledger, RefundRecord, no_such_charge};
use crate::answer::Answer;

impl Ledger {
    /// Charges, newest first. `starting_after` is found through the index.
    pub(crate) fn list_charges(
        &self,
        limit: Option<usize>,
        starting_after: Option<&str>,
    ) -> Answer {
        let end = match starting_after {
            None => self.charges.len(),
            Some(id) => match self.charge_index.get(id) {
                Some(&position) => position,
                None => return no_such_object(),
            },
        };
        let older = self.charges.get(..end).unwrap_or_default();
        list_page(older.iter().rev(), limit, "/v1/charges", ChargeRecord::to_json)
    }

    /// Refunds, newest first: all of them, or those of one charge (`charge`).
    pub(crate) fn list_refunds(
        &self,
        charge: Option<&str>,
        limit: Option<usize>,
        starting_after: Option<&str>,
    ) -> Answer {
        let Some(charge) = charge else {
            return refund_page(self.refunds.iter().rev(), limit, starting_after);
        };
        let Some(position) = self.charge_index.get(charge) else {
            return no_such_charge("charge");
        };
        let of_charge = self.refunds_by_charge.get(position).map_or(&[][..], Vec::as_slice);
        let refunds = of_charge.iter().rev().filter_map(|&p| self.refunds.get(p));
        refund_page(refunds, limit, starting_after)
    }
}

/// A page of refunds, newest first, after `starting_after` (found by its id: refunds are few
/// beside charges, and a scan compares ids without serializing anything).
pub(super) fn refund_page<'a>(
    refunds: impl Iterator<Item = &'a RefundRecord> + Clone,
    limit: Option<usize>,
    starting_after: Option<&str>,
) -> Answer {
    let start = match starting_after {
        None => 0,
        Some(id) => match refunds.clone().position(|refund| refund.id == id) {
            Some(position) => position + 1,
            None => return no_such_object(),
        },
    };
    list_page(refunds.skip(start), limit, "/v1/refunds", RefundRecord::to_json)
}

fn no_such_object() -> Answer {
    Answer::bad_param("resource_missing", Some("starting_after"), "No such object.")
}

/// Stripe's lists take at most 100 a page, 10 unless told.
pub(super) fn page_size(limit: Option<usize>) -> usize {
    limit.unwrap_or(10).clamp(1, 100)
}

/// A page of a newest-first list, Stripe's way: `items` starts just after `starting_after`.
pub(super) fn list_page<'a, T: 'a>(
    mut items: impl Iterator<Item = &'a T>,
    limit: Option<usize>,
    url: &str,
    to_json: impl Fn(&T) -> Value,
) -> Answer {
    let data: Vec<Value> = items.by_ref().take(page_size(limit)).map(to_json).collect();
    let has_more = items.next().is_some();
    Answer::ok(json!({"object": "list", "data": data, "has_more": has_more, "url": url}))
}
