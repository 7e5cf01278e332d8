//! Reading PaymentIntents: `GET /v1/payment_intents/{id}`, `GET /v1/payment_intents` (newest
//! first, a page at a time either way), `GET /v1/payment_intents/search` (charge search's query
//! language and lag), and what refunds need of an intent (its charge to refund, its refunds).

use axum::http::StatusCode;
use serde_json::json;

use super::super::lists::{page_size, refund_page};
use super::super::search::{Clause, SearchRequest, Searched, search};
use super::super::{Ledger, no_such_charge};
use super::{IntentListQuery, IntentRecord, IntentStatus, no_such_intent};
use crate::answer::Answer;

/// Stripe's refusal of a list cursor it does not know.
fn no_such_cursor(param: &str, id: &str) -> Answer {
    let message = format!("No such payment_intent: '{id}'");
    Answer::refused(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "resource_missing",
        Some(param),
        &message,
    )
}

impl Ledger {
    /// `GET /v1/payment_intents/{id}`.
    pub(crate) fn retrieve_intent(&self, id: &str) -> Answer {
        match self.intents.position(id) {
            Some(position) => Answer::ok(self.intents.json(position)),
            None => no_such_intent(id, "intent"),
        }
    }

    /// `GET /v1/payment_intents`: newest first; `starting_after` pages to older intents,
    /// `ending_before` to newer ones (the page just before the cursor).
    pub(crate) fn list_intents(&self, query: &IntentListQuery) -> Answer {
        let records = &self.intents.records;
        let limit = page_size(query.limit);
        // Positions, newest first, of the page and whether more lie beyond it.
        let (page, has_more): (Vec<usize>, bool) =
            match (&query.starting_after, &query.ending_before) {
                (Some(id), _) => {
                    let Some(cursor) = self.intents.position(id) else {
                        return no_such_cursor("starting_after", id);
                    };
                    let page: Vec<usize> = (0..cursor).rev().take(limit).collect();
                    (page, cursor > limit)
                }
                (None, Some(id)) => {
                    let Some(cursor) = self.intents.position(id) else {
                        return no_such_cursor("ending_before", id);
                    };
                    let end = cursor.saturating_add(1).saturating_add(limit).min(records.len());
                    let page: Vec<usize> = (cursor + 1..end).rev().collect();
                    (page, end < records.len())
                }
                (None, None) => {
                    let page: Vec<usize> = (0..records.len()).rev().take(limit).collect();
                    (page, records.len() > limit)
                }
            };
        let data: Vec<_> = page.into_iter().map(|position| self.intents.json(position)).collect();
        Answer::ok(json!({
            "object": "list", "data": data, "has_more": has_more, "url": "/v1/payment_intents",
        }))
    }

    /// `GET /v1/payment_intents/search`: as charge search, over intents.
    pub(crate) fn search_intents(
        &mut self,
        query: Option<&str>,
        limit: Option<usize>,
        page: Option<&str>,
        search_lag_ms: u64,
    ) -> Answer {
        self.stats.payment_intent_searches += 1;
        let searched = Searched {
            records: &self.intents.records,
            index: &self.intents.metadata_index,
            holds: |intent: &IntentRecord, clause: &Clause| {
                intent.holds(&clause.key, &clause.value)
            },
            created_ms: |intent| intent.created_ms,
            to_json: IntentRecord::to_json,
            url: "/v1/payment_intents/search",
        };
        let now_ms = self.clock.now_ms();
        search(&searched, SearchRequest { query, limit, page, now_ms, search_lag_ms })
    }

    /// The charge a refund by `payment_intent` refunds: the intent's latest charge, once it has
    /// succeeded. An authorization (`requires_capture`) is released by canceling, as at Stripe.
    pub(in crate::ledger) fn refundable_charge_of(&self, id: &str) -> Result<String, Answer> {
        let Some(intent) = self.intents.position(id).and_then(|p| self.intents.get(p)) else {
            return Err(no_such_intent(id, "payment_intent"));
        };
        match (intent.status, &intent.latest_charge) {
            (IntentStatus::Succeeded, Some(charge)) => Ok(charge.clone()),
            (IntentStatus::RequiresCapture, _) => {
                let message = format!(
                    "This PaymentIntent ({id}) has a status of requires_capture and its charge \
                     has not been captured. You must cancel the PaymentIntent to release the \
                     authorization instead of refunding it."
                );
                Err(Answer::invalid("charge_not_refundable", Some("payment_intent"), &message))
            }
            _ => {
                let message = format!(
                    "This PaymentIntent ({id}) does not have a successful charge to refund."
                );
                Err(Answer::invalid("charge_not_refundable", Some("payment_intent"), &message))
            }
        }
    }

    /// `GET /v1/refunds?payment_intent=pi_…`: the refunds of the intent's charge, newest first.
    pub(crate) fn list_refunds_of_intent(
        &self,
        id: &str,
        limit: Option<usize>,
        starting_after: Option<&str>,
    ) -> Answer {
        let Some(intent) = self.intents.position(id).and_then(|p| self.intents.get(p)) else {
            return no_such_intent(id, "payment_intent");
        };
        let charge = match intent.latest_charge.as_deref() {
            None => None,
            Some(charge) => match self.charge_index.get(charge) {
                Some(&position) => Some(position),
                None => return no_such_charge("charge"),
            },
        };
        let of_charge = charge
            .and_then(|position| self.refunds_by_charge.get(&position))
            .map_or(&[][..], Vec::as_slice);
        let refunds = of_charge.iter().rev().filter_map(|&p| self.refunds.get(p));
        refund_page(refunds, limit, starting_after)
    }
}

impl Ledger {
    /// Where the authentication page sends the customer back after authenticating the intent
    /// `id`, with what Stripe appends (`payment_intent`, `payment_intent_client_secret`,
    /// `redirect_status`); `None` if the intent has no `return_url`.
    pub(crate) fn authentication_return(&self, id: &str) -> Option<String> {
        let intent = self.intents.position(id).and_then(|p| self.intents.get(p))?;
        let return_url = intent.return_url.as_deref()?;
        let redirect_status = match intent.status {
            IntentStatus::Succeeded | IntentStatus::RequiresCapture => "succeeded",
            IntentStatus::Processing => "processing",
            _ => "failed",
        };
        let separator = if return_url.contains('?') { '&' } else { '?' };
        Some(format!(
            "{return_url}{separator}payment_intent={id}&payment_intent_client_secret={}&\
             redirect_status={redirect_status}",
            intent.client_secret
        ))
    }
}
