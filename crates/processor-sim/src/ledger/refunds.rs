//! Refunds: `POST /v1/refunds`, which refunds a captured charge in whole or in part, or releases
//! an uncaptured one whole, and raises the charge's `charge.refunded` event.

use super::{Ledger, RefundRecord, amount, metadata, new_id, no_such_charge, param};
use crate::answer::Answer;
use crate::webhooks::ChargeEvent;

impl Ledger {
    pub(crate) fn create_refund(&mut self, params: &[(String, String)]) -> Answer {
        let requested = match amount(params, "amount") {
            Ok(requested) => requested,
            Err(answer) => return answer,
        };
        let Some(charge_id) = param(params, "charge").map(str::to_owned) else {
            return Answer::bad_param(
                "parameter_missing",
                Some("charge"),
                "Missing required param: charge.",
            );
        };
        let reason = param(params, "reason").map(str::to_owned);
        let refund_metadata = metadata(params);
        let Some(&position) = self.charge_index.get(&charge_id) else {
            return no_such_charge("charge");
        };
        let created = self.next_created();
        let Some(charge) = self.charges.get_mut(position) else {
            return no_such_charge("charge");
        };
        if !charge.paid {
            return Answer::invalid(
                "charge_not_refundable",
                Some("charge"),
                "A failed charge cannot be refunded.",
            );
        }
        let remaining = charge.amount - charge.amount_refunded;
        let amount = match requested {
            // Releasing an authorization releases all of it.
            Some(amount) if !charge.captured && amount != remaining => {
                return Answer::invalid(
                    "amount_too_large",
                    Some("amount"),
                    "An uncaptured charge is released whole.",
                );
            }
            Some(amount) => amount,
            None => remaining,
        };
        if remaining == 0 {
            return Answer::invalid(
                "charge_already_refunded",
                Some("charge"),
                "The charge has already been refunded.",
            );
        }
        if amount > remaining {
            return Answer::invalid(
                "amount_too_large",
                Some("amount"),
                "Refund amount is greater than what remains.",
            );
        }
        charge.amount_refunded += amount;
        self.raised.push((ChargeEvent::Refunded, charge.to_json()));
        let refund = RefundRecord {
            id: new_id("re"),
            account: self.acting_account.clone(),
            charge: charge_id,
            amount,
            reason,
            metadata: refund_metadata,
            created,
        };
        let body = refund.to_json();
        self.refunds_by_charge.entry(position).or_default().push(self.refunds.len());
        self.refunds.push(refund);
        self.stats.refunds_created += 1;
        Answer::ok(body)
    }
}
