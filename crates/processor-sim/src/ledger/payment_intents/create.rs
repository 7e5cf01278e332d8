//! `POST /v1/payment_intents` and `POST /v1/payment_intents/{id}/confirm`: an intent is made
//! (`requires_payment_method` or `requires_confirmation`), and confirming it lets its test card
//! decide: a charge that succeeds (`succeeded`, or `requires_capture` with manual capture), a
//! decline (Stripe's 402 with the intent inside), or `requires_action` until the customer
//! authenticates.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::super::charges::{NewCharge, card_error};
use super::super::test_cards::{Decline, TokenOutcome, token_outcome};
use super::super::{Ledger, metadata, new_id, param};
use super::params::{CreateParams, create_params, return_url, return_url_required};
use super::{
    CaptureMethod, IntentRecord, IntentStatus, doc_url, no_such_intent, payment_method_json,
    unexpected_state,
};
use crate::answer::Answer;
use crate::webhooks::EventType;

/// Looks a payment method up, as Stripe does before anything else: an unknown one is an answer
/// the key keeps.
fn known_payment_method(token: &str) -> Result<TokenOutcome, Answer> {
    token_outcome(token).ok_or_else(|| {
        let message = format!("No such PaymentMethod: '{token}'");
        Answer::invalid("resource_missing", Some("payment_method"), &message)
    })
}

impl Ledger {
    /// `POST /v1/payment_intents`; `base_url` is the stand-in's own, for the authentication page.
    pub(crate) fn create_intent(&mut self, params: &[(String, String)], base_url: &str) -> Answer {
        let CreateParams {
            amount,
            currency,
            capture_method,
            confirm,
            allow_redirects,
            payment_method_types,
            payment_method,
            return_url,
        } = match create_params(params) {
            Ok(checked) => checked,
            Err(answer) => return answer,
        };
        if let Some(token) = &payment_method
            && let Err(answer) = known_payment_method(token)
        {
            return answer;
        }
        let id = new_id("pi");
        let status = if payment_method.is_some() {
            IntentStatus::RequiresConfirmation
        } else {
            IntentStatus::RequiresPaymentMethod
        };
        let intent = IntentRecord {
            client_secret: format!("{id}_secret_{}", &new_id("s")[2..]),
            id,
            account: self.acting_account.clone(),
            amount,
            amount_capturable: 0,
            amount_received: 0,
            allow_redirects,
            canceled_at: None,
            cancellation_reason: None,
            capture_method,
            created: self.unix_now_s(),
            created_ms: self.clock.now_ms(),
            currency,
            description: param(params, "description").map(str::to_owned),
            last_payment_error: None,
            latest_charge: None,
            metadata: metadata(params),
            next_action: None,
            payment_method,
            payment_method_types: payment_method_types.unwrap_or_else(|| vec!["card".to_owned()]),
            return_url,
            status,
            action_since_ms: None,
        };
        let position = self.intents.records.len();
        for (key, value) in &intent.metadata {
            self.intents.metadata_index.add(key, value, position);
        }
        self.intents.index.insert(intent.id.clone(), position);
        self.intents.records.push(intent);
        self.stats.payment_intents_created += 1;
        if confirm {
            return self.confirm_at(position, base_url);
        }
        Answer::ok(self.intents.json(position))
    }

    /// `POST /v1/payment_intents/{id}/confirm` (`payment_method`, `return_url`).
    pub(crate) fn confirm_intent(
        &mut self,
        id: &str,
        params: &[(String, String)],
        base_url: &str,
    ) -> Answer {
        let return_url = match return_url(params) {
            Ok(url) => url,
            Err(answer) => return answer,
        };
        let payment_method = param(params, "payment_method");
        let Some(position) = self.intents.position(id) else {
            return no_such_intent(id, "intent");
        };
        let Some(intent) = self.intents.get(position) else {
            return no_such_intent(id, "intent");
        };
        let status = intent.status;
        if !matches!(
            status,
            IntentStatus::RequiresPaymentMethod
                | IntentStatus::RequiresConfirmation
                | IntentStatus::RequiresAction
        ) {
            let message = format!(
                "You cannot confirm this PaymentIntent because it has a status of {}. Only a \
                 PaymentIntent with one of the following statuses may be confirmed: \
                 requires_confirmation, requires_payment_method, requires_action.",
                status.as_str()
            );
            return unexpected_state(intent.to_json(), &message);
        }
        if intent.allow_redirects == Some("always")
            && return_url.is_none()
            && intent.return_url.is_none()
        {
            return return_url_required();
        }
        if let Some(token) = payment_method
            && let Err(answer) = known_payment_method(token)
        {
            return answer;
        }
        if payment_method.is_none() && intent.payment_method.is_none() {
            let message = "You cannot confirm this PaymentIntent because it's missing a payment \
                           method. You can either update the PaymentIntent with a payment method \
                           and then confirm it again, or confirm it again directly with a payment \
                           method.";
            return unexpected_state(intent.to_json(), message);
        }
        if let Some(intent) = self.intents.get_mut(position) {
            if let Some(token) = payment_method {
                intent.payment_method = Some(token.to_owned());
            }
            if return_url.is_some() {
                intent.return_url = return_url;
            }
        }
        self.confirm_at(position, base_url)
    }

    /// Confirms the intent at `position`, whose payment method is known: its test card decides.
    fn confirm_at(&mut self, position: usize, base_url: &str) -> Answer {
        let outcome = self
            .intents
            .get(position)
            .and_then(|intent| intent.payment_method.as_deref())
            .and_then(token_outcome);
        match outcome {
            Some(TokenOutcome::Succeeds) => {
                self.authorize_intent(position);
                Answer::ok(self.intents.json(position))
            }
            Some(TokenOutcome::Declined(decline)) => self.decline_intent(position, &decline),
            Some(TokenOutcome::RequiresAuthentication) => {
                self.await_authentication(position, base_url);
                Answer::ok(self.intents.json(position))
            }
            // Checked by the callers; an intent without a known card cannot be confirmed.
            None => Answer::invalid("resource_missing", Some("payment_method"), "No such card."),
        }
    }

    /// The intent's charge of the whole amount under its capture method.
    fn intent_charge(&self, position: usize) -> Option<NewCharge> {
        let intent = self.intents.get(position)?;
        Some(NewCharge {
            account: intent.account.clone(),
            amount: intent.amount,
            currency: intent.currency.clone(),
            description: intent.description.clone(),
            metadata: intent.metadata.clone(),
            capture: intent.capture_method != CaptureMethod::Manual,
            payment_intent: Some(intent.id.clone()),
        })
    }

    /// The card was authorized (at once, or once the customer authenticated): makes the charge,
    /// and the intent is `succeeded`, or `requires_capture` with manual capture.
    pub(super) fn authorize_intent(&mut self, position: usize) {
        let Some(new) = self.intent_charge(position) else { return };
        let charge_position = self.make_charge(new, None);
        let charge_id = self.charges.get(charge_position).map(|charge| charge.id.clone());
        let Some(intent) = self.intents.get_mut(position) else { return };
        intent.latest_charge = charge_id;
        intent.next_action = None;
        intent.last_payment_error = None;
        intent.action_since_ms = None;
        let kind = if intent.capture_method == CaptureMethod::Manual {
            intent.status = IntentStatus::RequiresCapture;
            intent.amount_capturable = intent.amount;
            EventType::PaymentIntentAmountCapturableUpdated
        } else {
            intent.status = IntentStatus::Succeeded;
            intent.amount_received = intent.amount;
            EventType::PaymentIntentSucceeded
        };
        self.raised.push((kind, intent.to_json()));
    }

    /// The issuer declined: a failed charge, the intent back to `requires_payment_method` with
    /// the error, and Stripe's 402 with the intent inside.
    fn decline_intent(&mut self, position: usize, decline: &Decline) -> Answer {
        let Some(new) = self.intent_charge(position) else {
            return Answer::invalid("resource_missing", Some("intent"), "No such intent.");
        };
        let charge_position = self.make_charge(new, Some(decline));
        let charge_id = self.charges.get(charge_position).map_or("", |c| c.id.as_str()).to_owned();
        let Some(intent) = self.intents.get_mut(position) else {
            return Answer::invalid("resource_missing", Some("intent"), "No such intent.");
        };
        let mut error = card_error(decline, &charge_id);
        error["doc_url"] = doc_url(decline.code).into();
        if let Some(token) = intent.payment_method.take() {
            error["payment_method"] = payment_method_json(&token);
        }
        if decline.code == "incorrect_cvc" {
            error["param"] = "cvc".into();
        }
        intent.last_payment_error = Some(error.clone());
        intent.latest_charge = Some(charge_id);
        intent.status = IntentStatus::RequiresPaymentMethod;
        intent.next_action = None;
        intent.action_since_ms = None;
        let body = intent.to_json();
        self.raised.push((EventType::PaymentIntentPaymentFailed, body.clone()));
        error["payment_intent"] = body;
        Answer { status: StatusCode::PAYMENT_REQUIRED, ..Answer::ok(json!({ "error": error })) }
    }

    /// The card asks for 3-D Secure: `requires_action` with where to send the customer (the
    /// stand-in's own authentication page), until it is completed, failed, or expires.
    fn await_authentication(&mut self, position: usize, base_url: &str) {
        let now_ms = self.clock.now_ms();
        let Some(intent) = self.intents.get_mut(position) else { return };
        let url = format!("{base_url}/_sim/authenticate/{}", intent.id);
        let next_action: Value = match &intent.return_url {
            Some(return_url) => json!({
                "type": "redirect_to_url",
                "redirect_to_url": {"url": url, "return_url": return_url},
            }),
            None => json!({
                "type": "use_stripe_sdk",
                "use_stripe_sdk": {
                    "type": "three_d_secure_redirect", "stripe_js": url,
                    "source": new_id("src"),
                },
            }),
        };
        intent.next_action = Some(next_action);
        intent.status = IntentStatus::RequiresAction;
        intent.last_payment_error = None;
        intent.action_since_ms = Some(now_ms);
        self.raised.push((EventType::PaymentIntentRequiresAction, intent.to_json()));
        self.intents.awaiting.push_back((now_ms, position));
    }
}
