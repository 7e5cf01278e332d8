//! The HTTP client as a [`CardProcessor`]: each call's method and path, and the lookups that read
//! a bounded number of Stripe's search and list pages (PaymentIntents by our payment's id, refunds
//! by their PaymentIntent).

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::answer::unknown;
use super::{CardProcessor, ProcessorClient, ProcessorError};
use crate::types::{FrozenRequest, PaymentIntent, Refund, mask_token};

/// Stripe's search result page.
#[derive(Debug, Deserialize)]
struct SearchPage<T> {
    data: Vec<T>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    next_page: Option<String>,
}

/// Stripe's list page.
#[derive(Debug, Deserialize)]
struct ListPage<T> {
    data: Vec<T>,
    #[serde(default)]
    has_more: bool,
}

/// Lookups read at most this many pages: a reconciliation looks for one object, and a runaway
/// cursor must not hold a lease for ever.
const MAX_PAGES: usize = 10;

/// A value for a Stripe search query string literal.
fn search_literal(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

impl ProcessorClient {
    /// Every PaymentIntent that `/v1/payment_intents/search` finds with `metadata[payment_id]` =
    /// `payment_id`, page after page.
    async fn search_by_payment(
        &self,
        payment_id: &str,
    ) -> Result<Vec<PaymentIntent>, ProcessorError> {
        let query = format!("metadata['payment_id']:'{}'", search_literal(payment_id));
        let mut found = Vec::new();
        let mut page: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = vec![("query", query.as_str()), ("limit", "100")];
            if let Some(page) = &page {
                params.push(("page", page));
            }
            let encoded = serde_urlencoded::to_string(&params)
                .map_err(|err| unknown(format!("cannot encode a search: {err}")))?;
            let path = format!("/v1/payment_intents/search?{encoded}");
            let result: SearchPage<PaymentIntent> =
                self.call(Method::GET, &path, None, None).await?;
            found.extend(result.data);
            match result.next_page {
                Some(next) if result.has_more => page = Some(next),
                _ => return Ok(found),
            }
        }
        Err(unknown(format!("the search for {payment_id} has more than {MAX_PAGES} pages")))
    }

    /// Every refund of PaymentIntent `id`, page after page.
    async fn refunds_of(&self, id: &str) -> Result<Vec<Refund>, ProcessorError> {
        let mut found: Vec<Refund> = Vec::new();
        for _ in 0..MAX_PAGES {
            let mut params = vec![("payment_intent", id), ("limit", "100")];
            if let Some(last) = found.last() {
                params.push(("starting_after", &last.id));
            }
            let encoded = serde_urlencoded::to_string(&params)
                .map_err(|err| unknown(format!("cannot encode a list: {err}")))?;
            let result: ListPage<Refund> =
                self.call(Method::GET, &format!("/v1/refunds?{encoded}"), None, None).await?;
            let more = result.has_more && !result.data.is_empty();
            found.extend(result.data);
            if !more {
                return Ok(found);
            }
        }
        Err(unknown(format!("the refunds of {id} fill more than {MAX_PAGES} pages")))
    }

    /// Sends a frozen money-moving request: its path, its form, its key.
    async fn send<T: DeserializeOwned>(
        &self,
        request: &FrozenRequest,
    ) -> Result<T, ProcessorError> {
        self.call(Method::POST, &request.path, Some(&request.form), Some(&request.key)).await
    }
}

impl CardProcessor for ProcessorClient {
    async fn create_refund(&self, request: &FrozenRequest) -> Result<Refund, ProcessorError> {
        self.send(request).await
    }

    async fn create_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        tracing::debug!(key = %request.key, payment_method = %request.field("payment_method").map(mask_token).unwrap_or_default(), "creating a payment intent");
        self.send(request).await
    }

    async fn capture_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.send(request).await
    }

    async fn cancel_payment_intent(
        &self,
        request: &FrozenRequest,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.send(request).await
    }

    async fn retrieve_payment_intent(
        &self,
        intent_id: &str,
    ) -> Result<PaymentIntent, ProcessorError> {
        self.call(Method::GET, &format!("/v1/payment_intents/{intent_id}"), None, None).await
    }

    async fn search_payment_intents(
        &self,
        payment_id: &str,
    ) -> Result<Vec<PaymentIntent>, ProcessorError> {
        self.search_by_payment(payment_id).await
    }

    async fn list_intent_refunds(&self, intent_id: &str) -> Result<Vec<Refund>, ProcessorError> {
        self.refunds_of(intent_id).await
    }

    fn search_lag(&self) -> Duration {
        self.config.search_lag
    }

    fn longest_call(&self) -> Duration {
        self.config.longest_call()
    }
}
