//! Charges: `POST /v1/charges` (the test tokens decide the outcome, as Stripe's test cards do),
//! `POST /v1/charges/{id}/capture` and `GET /v1/charges/{id}`, and the making and capturing of a
//! charge that PaymentIntents share. Each change raises its event.

use axum::http::StatusCode;
use serde_json::{Value, json};

use std::collections::BTreeMap;
use std::sync::Arc;

use super::test_cards::{AUTHENTICATION_REQUIRED, Decline, TokenOutcome, token_outcome};
use super::{ChargeRecord, Ledger, Outcome, amount, metadata, new_id, no_such_charge, param};
use crate::answer::Answer;
use crate::webhooks::EventType;

/// What a new charge is made of, whether `POST /v1/charges` or a PaymentIntent's confirmation
/// makes it.
pub(super) struct NewCharge {
    /// The secret key it belongs to: the request's, or its PaymentIntent's (whose authentication
    /// may be completed outside any request).
    pub account: Arc<str>,
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// Captured at once (else only authorized).
    pub capture: bool,
    /// The PaymentIntent it was made under, if any.
    pub payment_intent: Option<String>,
}

/// The 402 `card_error` of a decline, for the charge `charge_id`.
pub(super) fn card_error(decline: &Decline, charge_id: &str) -> serde_json::Value {
    let Decline { code, decline_code, message } = *decline;
    json!({
        "type": "card_error", "code": code, "decline_code": decline_code, "message": message,
        "charge": charge_id,
    })
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
        let decline = match outcome {
            TokenOutcome::Succeeds => None,
            TokenOutcome::Declined(decline) => Some(decline),
            // A bare charge cannot authenticate the customer.
            TokenOutcome::RequiresAuthentication => Some(AUTHENTICATION_REQUIRED),
        };
        let new = NewCharge {
            account: self.acting_account.clone(),
            amount,
            currency,
            description: param(params, "description").map(str::to_owned),
            metadata: metadata(params),
            capture,
            payment_intent: None,
        };
        let position = self.make_charge(new, decline.as_ref());
        let Some(charge) = self.charges.get(position) else {
            return no_such_charge("charge");
        };
        match decline {
            None => Answer::ok(charge.to_json()),
            Some(decline) => {
                let body = json!({ "error": card_error(&decline, &charge.id) });
                Answer { status: StatusCode::PAYMENT_REQUIRED, body, ..Answer::ok(Value::Null) }
            }
        }
    }

    /// Makes a charge, authorized (and captured if asked) or declined as `decline` says, counts
    /// it, indexes it and raises its event; returns its position.
    pub(super) fn make_charge(&mut self, new: NewCharge, decline: Option<&Decline>) -> usize {
        let created = self.next_created();
        let mut charge = ChargeRecord {
            account: new.account,
            id: new_id("ch"),
            amount: new.amount,
            currency: new.currency,
            captured: false,
            paid: false,
            status: "failed",
            amount_captured: 0,
            amount_refunded: 0,
            description: new.description,
            metadata: new.metadata,
            failure_code: None,
            failure_message: None,
            outcome: Outcome::Authorized,
            payment_intent: new.payment_intent,
            created,
            created_ms: self.clock.now_ms(),
        };
        match decline {
            None => {
                charge.paid = true;
                charge.status = "succeeded";
                if new.capture {
                    charge.captured = true;
                    charge.amount_captured = new.amount;
                }
            }
            Some(decline) => {
                // As on Stripe's charge: the error's code and message, and the decline code as
                // the outcome's reason.
                charge.failure_code = Some(decline.code.to_owned());
                charge.failure_message = Some(decline.message.to_owned());
                charge.outcome = Outcome::IssuerDeclined { reason: decline.decline_code };
            }
        }
        self.stats.charges_created += 1;
        let kind = if charge.paid { EventType::ChargeSucceeded } else { EventType::ChargeFailed };
        self.raised.push((kind, charge.to_json()));
        let position = self.charges.len();
        for (key, value) in &charge.metadata {
            self.metadata_index.add(key, value, position);
        }
        self.charge_index.insert(charge.id.clone(), position);
        self.charges.push(charge);
        position
    }

    pub(crate) fn capture(&mut self, id: &str, params: &[(String, String)]) -> Answer {
        let requested = match amount(params, "amount") {
            Ok(requested) => requested,
            Err(answer) => return answer,
        };
        let Some(&position) = self.charge_index.get(id) else {
            return no_such_charge("charge");
        };
        // A charge made under a PaymentIntent is captured through it, so the two stay agreed.
        let intent = self.charges.get(position).and_then(|charge| charge.payment_intent.clone());
        if let Some(intent) = intent {
            let answer = self.capture_intent_amount(&intent, requested);
            if !answer.status.is_success() {
                return answer;
            }
            return self.retrieve_charge(id);
        }
        match self.capture_at(position, requested, "amount") {
            Ok(body) => Answer::ok(body),
            Err(answer) => answer,
        }
    }

    /// Captures the authorized charge at `position` (`requested`, or all of it), releases the
    /// rest, and raises `charge.captured`; answers the charge. `param` names the amount in the
    /// caller's request, for the error.
    pub(super) fn capture_at(
        &mut self,
        position: usize,
        requested: Option<i64>,
        param: &str,
    ) -> Result<Value, Answer> {
        let Some(charge) = self.charges.get_mut(position) else {
            return Err(no_such_charge("charge"));
        };
        if !charge.paid || charge.captured || charge.amount_refunded > 0 {
            return Err(Answer::invalid(
                "charge_already_captured",
                None,
                "This charge cannot be captured.",
            ));
        }
        let captured = requested.unwrap_or(charge.amount);
        if captured > charge.amount {
            return Err(Answer::invalid(
                "amount_too_large",
                Some(param),
                "Cannot capture more than was authorized.",
            ));
        }
        charge.captured = true;
        charge.amount_captured = captured;
        // As Stripe does, the uncaptured remainder is released.
        charge.amount_refunded = charge.amount - captured;
        let body = charge.to_json();
        self.stats.captures += 1;
        self.raised.push((EventType::ChargeCaptured, body.clone()));
        Ok(body)
    }

    pub(crate) fn retrieve_charge(&self, id: &str) -> Answer {
        match self.charge_index.get(id).and_then(|&i| self.charges.get(i)) {
            Some(charge) => Answer::ok(charge.to_json()),
            None => no_such_charge("id"),
        }
    }
}
