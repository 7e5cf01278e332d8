//! What happens to a PaymentIntent after its confirmation: `POST /v1/payment_intents/{id}/capture`
//! (all or part of what was authorized; the rest is released), `…/cancel` (releasing an
//! authorization), and the customer's 3-D Secure authentication, which the stand-in's test page
//! completes or fails, and which fails by itself once `authentication_ttl_s` has passed.

use super::super::{Ledger, amount, param};
use super::{AuthenticationOutcome, IntentStatus, doc_url, no_such_intent, payment_method_json};
use super::{IntentRecord, unexpected_state};
use crate::answer::Answer;
use crate::webhooks::EventType;

/// Stripe's `cancellation_reason`s that a caller may give.
const CANCELLATION_REASONS: [&str; 4] =
    ["duplicate", "fraudulent", "requested_by_customer", "abandoned"];

impl Ledger {
    /// `POST /v1/payment_intents/{id}/capture` (`amount_to_capture`, all that is capturable
    /// unless told).
    pub(crate) fn capture_intent(&mut self, id: &str, params: &[(String, String)]) -> Answer {
        match amount(params, "amount_to_capture") {
            Ok(requested) => self.capture_intent_amount(id, requested),
            Err(answer) => answer,
        }
    }

    /// Captures `requested` (or all that is capturable) of the intent `id`.
    pub(in crate::ledger) fn capture_intent_amount(
        &mut self,
        id: &str,
        requested: Option<i64>,
    ) -> Answer {
        let Some(position) = self.intents.position(id) else {
            return no_such_intent(id, "intent");
        };
        let Some(intent) = self.intents.get(position) else {
            return no_such_intent(id, "intent");
        };
        if intent.status != IntentStatus::RequiresCapture {
            let message = format!(
                "This PaymentIntent could not be captured because it has a status of {}. Only a \
                 PaymentIntent with one of the following statuses may be captured: \
                 requires_capture.",
                intent.status.as_str()
            );
            return unexpected_state(intent.to_json(), &message);
        }
        let capturable = intent.amount_capturable;
        let captured = requested.unwrap_or(capturable);
        if captured > capturable {
            let message = format!(
                "The amount_to_capture ({captured}) is greater than the amount capturable \
                 ({capturable})."
            );
            return Answer::invalid("amount_too_large", Some("amount_to_capture"), &message);
        }
        let charge = intent.latest_charge.as_deref().and_then(|c| self.charge_index.get(c));
        let Some(&charge_position) = charge else {
            return unexpected_state(intent.to_json(), "This PaymentIntent has no charge.");
        };
        if let Err(answer) = self.capture_at(charge_position, Some(captured), "amount_to_capture") {
            return answer;
        }
        let Some(intent) = self.intents.get_mut(position) else {
            return no_such_intent(id, "intent");
        };
        intent.status = IntentStatus::Succeeded;
        intent.amount_received = captured;
        intent.amount_capturable = 0;
        let body = intent.to_json();
        self.raised.push((EventType::PaymentIntentSucceeded, body.clone()));
        Answer::ok(body)
    }

    /// `POST /v1/payment_intents/{id}/cancel` (`cancellation_reason`): from any state but
    /// `succeeded` and `canceled`; an authorization is released.
    pub(crate) fn cancel_intent(&mut self, id: &str, params: &[(String, String)]) -> Answer {
        let reason = param(params, "cancellation_reason");
        if let Some(reason) = reason.filter(|r| !CANCELLATION_REASONS.contains(r)) {
            let message = format!(
                "Invalid cancellation_reason: must be one of {}; got '{reason}'.",
                CANCELLATION_REASONS.join(", ")
            );
            return Answer::bad_param("parameter_invalid", Some("cancellation_reason"), &message);
        }
        let Some(position) = self.intents.position(id) else {
            return no_such_intent(id, "intent");
        };
        let Some(intent) = self.intents.get(position) else {
            return no_such_intent(id, "intent");
        };
        if matches!(intent.status, IntentStatus::Succeeded | IntentStatus::Canceled) {
            let message = format!(
                "You cannot cancel this PaymentIntent because it has a status of {}. Only a \
                 PaymentIntent with one of the following statuses may be canceled: \
                 requires_payment_method, requires_capture, requires_confirmation, \
                 requires_action, processing.",
                intent.status.as_str()
            );
            return unexpected_state(intent.to_json(), &message);
        }
        if intent.status == IntentStatus::RequiresCapture {
            let charge = intent.latest_charge.as_deref().and_then(|c| self.charge_index.get(c));
            if let Some(&charge_position) = charge {
                let held = self.charges.get(charge_position).map_or(0, |c| c.amount);
                self.refund_at(charge_position, held, None, Default::default());
            }
        }
        let canceled_at = self.unix_now_s();
        let Some(intent) = self.intents.get_mut(position) else {
            return no_such_intent(id, "intent");
        };
        intent.status = IntentStatus::Canceled;
        intent.canceled_at = Some(canceled_at);
        intent.cancellation_reason = reason.map(str::to_owned);
        intent.amount_capturable = 0;
        intent.next_action = None;
        intent.action_since_ms = None;
        let body = intent.to_json();
        self.stats.payment_intents_canceled += 1;
        self.raised.push((EventType::PaymentIntentCanceled, body.clone()));
        Answer::ok(body)
    }

    /// The customer's authentication of the intent `id` ended as `outcome` (the stand-in's test
    /// page, or `POST /_sim/payment_intents/{id}/authenticate`). Its events carry no key.
    pub(crate) fn authenticate_intent(
        &mut self,
        id: &str,
        outcome: AuthenticationOutcome,
    ) -> Answer {
        let answer = self.authenticate_at(id, outcome);
        self.stamp_events(None);
        answer
    }

    fn authenticate_at(&mut self, id: &str, outcome: AuthenticationOutcome) -> Answer {
        let Some(position) = self.intents.position(id) else {
            return no_such_intent(id, "intent");
        };
        let Some(intent) = self.intents.get(position) else {
            return no_such_intent(id, "intent");
        };
        if intent.status != IntentStatus::RequiresAction {
            let message = format!(
                "This PaymentIntent is not awaiting authentication: it has a status of {}.",
                intent.status.as_str()
            );
            return unexpected_state(intent.to_json(), &message);
        }
        match outcome {
            AuthenticationOutcome::Complete => self.authorize_intent(position),
            AuthenticationOutcome::Fail => self.fail_authentication(position),
        }
        Answer::ok(self.intents.json(position))
    }

    /// The authentication failed (or nobody completed it): the intent is back to
    /// `requires_payment_method` with Stripe's `payment_intent_authentication_failure`, and no
    /// charge is made.
    fn fail_authentication(&mut self, position: usize) {
        let Some(intent) = self.intents.get_mut(position) else { return };
        let code = "payment_intent_authentication_failure";
        let mut error = serde_json::json!({
            "type": "invalid_request_error", "code": code, "doc_url": doc_url(code),
            "message": "The provided PaymentMethod has failed authentication. You can provide \
                        payment_method_data or a new PaymentMethod to attempt to fulfill this \
                        PaymentIntent again.",
        });
        if let Some(token) = intent.payment_method.take() {
            error["payment_method"] = payment_method_json(&token);
        }
        intent.last_payment_error = Some(error);
        intent.status = IntentStatus::RequiresPaymentMethod;
        intent.next_action = None;
        intent.action_since_ms = None;
        self.raised.push((EventType::PaymentIntentPaymentFailed, intent.to_json()));
    }

    /// Fails every authentication that has waited `ttl_ms` or more on the stand-in's clock, and
    /// stamps their `payment_intent.payment_failed` events (with no key: nobody asked).
    pub(crate) fn expire_authentications(&mut self, ttl_ms: u64) {
        let now_ms = self.clock.now_ms();
        while let Some(&(since_ms, position)) = self.intents.awaiting.front() {
            if now_ms.saturating_sub(since_ms) < ttl_ms {
                break;
            }
            self.intents.awaiting.pop_front();
            let still_waiting = self.intents.get(position).is_some_and(|intent: &IntentRecord| {
                intent.status == IntentStatus::RequiresAction
                    && intent.action_since_ms == Some(since_ms)
            });
            if still_waiting {
                self.fail_authentication(position);
                self.stats.authentications_expired += 1;
            }
        }
        self.stamp_events(None);
    }
}
