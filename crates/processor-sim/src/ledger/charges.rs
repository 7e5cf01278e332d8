//! Charges: `POST /v1/charges` (the test tokens decide the outcome, as Stripe's test cards do),
//! `POST /v1/charges/{id}/capture` and `GET /v1/charges/{id}`. Each change raises its event.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{ChargeRecord, Ledger, Outcome, amount, metadata, new_id, no_such_charge, param};
use crate::answer::Answer;
use crate::webhooks::ChargeEvent;

/// The outcome of a payment-method token, as Stripe's test cards decide it.
enum TokenOutcome {
    Succeeds,
    Declined { code: &'static str, decline_code: &'static str, message: &'static str },
}

fn token_outcome(token: &str) -> Option<TokenOutcome> {
    let declined =
        |code, decline_code, message| Some(TokenOutcome::Declined { code, decline_code, message });
    match token {
        "pm_card_visa" | "pm_card_mastercard" | "tok_visa" | "tok_mastercard" => {
            Some(TokenOutcome::Succeeds)
        }
        "pm_card_chargeDeclined" | "tok_chargeDeclined" => {
            declined("card_declined", "generic_decline", "Your card was declined.")
        }
        "pm_card_chargeDeclinedInsufficientFunds" | "tok_chargeDeclinedInsufficientFunds" => {
            declined("card_declined", "insufficient_funds", "Your card has insufficient funds.")
        }
        "pm_card_chargeDeclinedExpiredCard" | "tok_chargeDeclinedExpiredCard" => {
            declined("expired_card", "expired_card", "Your card has expired.")
        }
        _ => None,
    }
}

impl Ledger {
    pub(crate) fn create_charge(&mut self, params: &[(String, String)]) -> Answer {
        let amount = match amount(params, "amount") {
            Ok(Some(amount)) => amount,
            Ok(None) => {
                return Answer::bad_param(
                    "parameter_missing",
                    Some("amount"),
                    "Missing required param: amount.",
                );
            }
            Err(answer) => return answer,
        };
        let currency = match param(params, "currency") {
            Some(c) if c.len() == 3 && c.bytes().all(|b| b.is_ascii_lowercase()) => c.to_owned(),
            _ => {
                return Answer::bad_param(
                    "parameter_invalid",
                    Some("currency"),
                    "Invalid currency.",
                );
            }
        };
        let Some(source) = param(params, "source") else {
            return Answer::bad_param(
                "parameter_missing",
                Some("source"),
                "Missing required param: source.",
            );
        };
        let capture = match param(params, "capture") {
            None | Some("true") => true,
            Some("false") => false,
            Some(_) => {
                return Answer::bad_param(
                    "parameter_invalid",
                    Some("capture"),
                    "capture must be true or false.",
                );
            }
        };
        // Looking the payment method up is part of executing, as at Stripe: an unknown one is
        // an answer the key keeps.
        let Some(outcome) = token_outcome(source) else {
            return Answer::invalid("resource_missing", Some("source"), "No such payment method.");
        };
        let created = self.next_created();
        let mut charge = ChargeRecord {
            account: self.acting_account.clone(),
            id: new_id("ch"),
            amount,
            currency,
            captured: false,
            paid: false,
            status: "failed",
            amount_captured: 0,
            amount_refunded: 0,
            description: param(params, "description").map(str::to_owned),
            metadata: metadata(params),
            failure_code: None,
            failure_message: None,
            outcome: Outcome::Authorized,
            created,
            created_ms: self.clock.now_ms(),
        };
        let answer = match outcome {
            TokenOutcome::Succeeds => {
                charge.paid = true;
                charge.status = "succeeded";
                if capture {
                    charge.captured = true;
                    charge.amount_captured = amount;
                }
                Answer::ok(charge.to_json())
            }
            TokenOutcome::Declined { code, decline_code, message } => {
                // As on Stripe's charge: the error's code and message, and the decline code as
                // the outcome's reason.
                charge.failure_code = Some(code.to_owned());
                charge.failure_message = Some(message.to_owned());
                charge.outcome = Outcome::IssuerDeclined { reason: decline_code };
                let body = json!({"error": {
                    "type": "card_error", "code": code, "decline_code": decline_code,
                    "message": message, "charge": charge.id,
                }});
                Answer { status: StatusCode::PAYMENT_REQUIRED, body, ..Answer::ok(Value::Null) }
            }
        };
        self.stats.charges_created += 1;
        let kind = if charge.paid { ChargeEvent::Succeeded } else { ChargeEvent::Failed };
        self.raised.push((kind, charge.to_json()));
        let position = self.charges.len();
        for (key, value) in &charge.metadata {
            self.metadata_index.add(key, value, position);
        }
        self.charge_index.insert(charge.id.clone(), position);
        self.charges.push(charge);
        answer
    }

    fn charge_mut(&mut self, id: &str) -> Option<&mut ChargeRecord> {
        let index = *self.charge_index.get(id)?;
        self.charges.get_mut(index)
    }

    pub(crate) fn capture(&mut self, id: &str, params: &[(String, String)]) -> Answer {
        let requested = match amount(params, "amount") {
            Ok(requested) => requested,
            Err(answer) => return answer,
        };
        let Some(charge) = self.charge_mut(id) else {
            return no_such_charge("charge");
        };
        if !charge.paid || charge.captured || charge.amount_refunded > 0 {
            return Answer::invalid(
                "charge_already_captured",
                None,
                "This charge cannot be captured.",
            );
        }
        let captured = requested.unwrap_or(charge.amount);
        if captured > charge.amount {
            return Answer::invalid(
                "amount_too_large",
                Some("amount"),
                "Cannot capture more than was authorized.",
            );
        }
        charge.captured = true;
        charge.amount_captured = captured;
        // As Stripe does, the uncaptured remainder is released.
        charge.amount_refunded = charge.amount - captured;
        let body = charge.to_json();
        self.stats.captures += 1;
        self.raised.push((ChargeEvent::Captured, body.clone()));
        Answer::ok(body)
    }

    pub(crate) fn retrieve_charge(&self, id: &str) -> Answer {
        match self.charge_index.get(id).and_then(|&i| self.charges.get(i)) {
            Some(charge) => Answer::ok(charge.to_json()),
            None => no_such_charge("id"),
        }
    }
}
