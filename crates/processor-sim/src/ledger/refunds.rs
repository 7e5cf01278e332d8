//! Refunds: `POST /v1/refunds`, which refunds a captured charge in whole or in part, or releases
//! an uncaptured one whole, and raises the charge's `charge.refunded` event. The charge is named
//! by `charge`, or by `payment_intent` (its latest charge), as at Stripe.

use std::collections::BTreeMap;

use super::{Ledger, RefundRecord, amount, metadata, new_id, no_such_charge, param};
use crate::answer::Answer;
use crate::webhooks::EventType;

impl Ledger {
    pub(crate) fn create_refund(&mut self, params: &[(String, String)]) -> Answer {
        let requested = match amount(params, "amount") {
            Ok(requested) => requested,
            Err(answer) => return answer,
        };
        let charge_id = match (param(params, "charge"), param(params, "payment_intent")) {
            (Some(charge), None) => charge.to_owned(),
            (None, Some(intent)) => match self.refundable_charge_of(intent) {
                Ok(charge) => charge,
                Err(answer) => return answer,
            },
            (Some(_), Some(_)) => {
                return Answer::bad_param(
                    "parameter_invalid",
                    Some("payment_intent"),
                    "You can only specify one of these parameters: charge, payment_intent.",
                );
            }
            (None, None) => {
                return Answer::bad_param(
                    "parameter_missing",
                    Some("charge"),
                    "Missing required param: charge.",
                );
            }
        };
        let reason = param(params, "reason").map(str::to_owned);
        let refund_metadata = metadata(params);
        let Some(&position) = self.charge_index.get(&charge_id) else {
            return no_such_charge("charge");
        };
        let Some(charge) = self.charges.get(position) else {
            return no_such_charge("charge");
        };
        if !charge.paid {
            return Answer::invalid(
                "charge_not_refundable",
                Some("charge"),
                "A failed charge cannot be refunded.",
            );
        }
        if let (false, Some(intent)) = (charge.captured, &charge.payment_intent) {
            // Stripe's rule: an authorization made by a PaymentIntent is released by canceling it.
            let message = format!(
                "This uncaptured Charge was created by a PaymentIntent ({intent}). You must cancel \
                 the PaymentIntent to reverse the authorization instead of refunding the Charge \
                 directly."
            );
            return Answer::invalid("charge_not_refundable", Some("charge"), &message);
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
        Answer::ok(self.refund_at(position, amount, reason, refund_metadata))
    }

    /// Refunds (or releases) `amount` of the charge at `position`, which the caller has checked
    /// can take it: records the refund, raises `charge.refunded`, and answers the refund.
    pub(super) fn refund_at(
        &mut self,
        position: usize,
        amount: i64,
        reason: Option<String>,
        metadata: BTreeMap<String, String>,
    ) -> serde_json::Value {
        let created = self.next_created();
        let Some(charge) = self.charges.get_mut(position) else {
            return serde_json::Value::Null;
        };
        charge.amount_refunded += amount;
        self.raised.push((EventType::ChargeRefunded, charge.to_json()));
        let refund = RefundRecord {
            id: new_id("re"),
            account: self.acting_account.clone(),
            charge: charge.id.clone(),
            payment_intent: charge.payment_intent.clone(),
            amount,
            reason,
            metadata,
            created,
        };
        let body = refund.to_json();
        self.refunds_by_charge.entry(position).or_default().push(self.refunds.len());
        self.refunds.push(refund);
        self.stats.refunds_created += 1;
        body
    }
}
