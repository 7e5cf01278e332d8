//! `POST /webhooks/processor`: the card processor's webhooks (`charge.succeeded`, `charge.failed`,
//! `charge.captured`, `charge.refunded`), the push path of reconciliation.
//!
//! No API key: the processor signs each delivery with `Stripe-Signature` and the endpoint's
//! secret (`processor.webhook_secret`; empty turns the route off). The body is read whole (the
//! edge's body limit holds) and verified over its exact bytes before anything is parsed. A refusal
//! is `400 invalid_request` and records nothing.
//!
//! Nobody is known until the signature holds, and the body must be read first: so the body is
//! read only after everything that needs no body (the route is on, the header is well-formed and
//! its timestamp within the tolerance). It is read as every body is, holding no place in flight
//! and within `http.body_deadline_ms` (`extract::read_body`), and under a small bound of the
//! webhooks' own (`processor.webhook_max_unverified`) until verified: bodies that trickle in from
//! anyone can fill only the webhook's places, never the ones paying clients need.
//!
//! Then: a verified event is recorded once by its id
//! (`payments_domain::processor_events::receive`) and answered `200`, a redelivery too, so the
//! processor stops retrying. An event about a charge that is not one of our payments' is recorded
//! and answered `200` as well: a processor retries anything else for days, and such charges
//! exist (made in its dashboard, say).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use payments_domain::PaymentId;
use payments_domain::processor_events::{self, Received, Refused, SIGNATURE_HEADER};
use payments_settings::ExposeSecret;
use serde::Serialize;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::error::{ApiError, ProblemCode};
use crate::extract::read_body;
use crate::openapi::{ApiRouter, OK, Problems, ProcessorEvent, Public, code, param};

/// This module's routes: each handler's path and method are in its `#[utoipa::path]`.
pub fn routes(api: ApiRouter) -> ApiRouter {
    api.routes(routes!(receive))
}

/// The answer to a verified delivery.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProcessorWebhookReceipt {
    /// The processor's event id.
    pub id: String,
    /// `recorded` (about one of our payments), `unmatched` (about an object we do not know),
    /// `duplicate` (received before; nothing changed) or `ignored` (a type this server does not
    /// take: nothing recorded).
    pub outcome: String,
    /// The payment the event is about, when it is one of ours.
    #[schema(value_type = Option<String>)]
    pub payment: Option<PaymentId>,
}

fn unix_now() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    i64::try_from(now).unwrap_or(i64::MAX)
}

/// A refused delivery: counted, logged, and answered `400`.
fn refused(refused: &Refused) -> ApiError {
    metrics::counter!("processor_webhooks_total", "outcome" => "refused").increment(1);
    tracing::warn!(reason = %refused, "a processor webhook was refused");
    refusal(refused)
}

fn refusal(refused: &Refused) -> ApiError {
    let error = ApiError::new(ProblemCode::InvalidRequest, format!("Webhook refused: {refused}."));
    match refused {
        Refused::NoSignature | Refused::Signature(_) => error.with_param(SIGNATURE_HEADER),
        Refused::Malformed(_) | Refused::UnknownType { .. } => error,
    }
}

/// `POST /webhooks/processor`
#[utoipa::path(
    post,
    path = "/webhooks/processor",
    operation_id = "receiveProcessorWebhook",
    tag = "webhooks",
    summary = "The card processor's webhooks (charge.* and payment_intent.*), signed with \
               Stripe-Signature; recorded once per event id, other types answered and ignored",
    params(param::StripeSignature),
    request_body(content = ProcessorEvent, content_type = "application/json"),
    responses(
        (status = 200, description = OK, body = ProcessorWebhookReceipt),
        Problems<Public, (
            code::InvalidRequest,
            code::ResourceMissing,
            code::PayloadTooLarge,
            code::InternalError,
            code::ServiceUnavailable,
        )>,
    )
)]
pub async fn receive(
    State(state): State<AppState>,
    request: Request,
) -> Result<Response, ApiError> {
    let processor = &state.settings.processor;
    let secret = processor.webhook_secret.expose_secret();
    if secret.is_empty() {
        // Before the body: a route that is off costs nobody a place while a body trickles in.
        return Err(ApiError::resource_missing(
            "Inbound processor webhooks are off on this server (processor.webhook_secret is \
             empty).",
        ));
    }
    let tolerance = Duration::from_secs(processor.webhook_tolerance_s);
    let signature = request.headers().get(SIGNATURE_HEADER).and_then(|value| value.to_str().ok());
    processor_events::check_header(signature, tolerance, unix_now()).map_err(|r| refused(&r))?;
    let signature = signature.map(str::to_owned);

    // The sender is unknown until the body is read and verified: wait for it under the webhooks'
    // own bound, out of the edge's. No place left is a 503, which the processor retries.
    let Ok(unverified) = state.unverified_webhooks.try_acquire() else {
        metrics::counter!("processor_webhooks_total", "outcome" => "shed").increment(1);
        return Err(ApiError::new(
            ProblemCode::ServiceUnavailable,
            "The server is reading as many unverified webhooks as it takes at once. Retry after \
             the number of seconds in Retry-After.",
        ));
    };
    // Read holding no place in flight, as every body is; the sender is known once it verifies.
    let body = read_body(request, &state).await?;
    let verified =
        processor_events::verify(&body, signature.as_deref(), secret, tolerance, unix_now());
    drop(unverified);
    let event = match verified {
        Ok(event) => event,
        // Signed by the processor, of a type we do not take: a refusal would be retried for days
        // (and could get the endpoint disabled, losing the events we do take).
        Err(Refused::UnknownType { event, kind }) => {
            metrics::counter!("processor_webhooks_total", "outcome" => "ignored").increment(1);
            tracing::info!(event_id = %event, event_type = %kind, "processor webhook of a type not taken: ignored");
            let receipt =
                ProcessorWebhookReceipt { id: event, outcome: "ignored".into(), payment: None };
            return Ok(Json(receipt).into_response());
        }
        Err(refusal) => return Err(refused(&refusal)),
    };

    let received = processor_events::receive(&state.pool, &event).await?;
    let (outcome, payment) = match received {
        Received::Recorded { payment_id, woke } => {
            tracing::info!(event_id = %event.id, event_type = %event.event_type, %payment_id, woke, "processor webhook recorded");
            ("recorded", Some(payment_id))
        }
        Received::Settled { payment_id, status } => {
            tracing::info!(event_id = %event.id, event_type = %event.event_type, %payment_id, %status, "processor webhook settled a payment that waited on its customer");
            ("recorded", Some(payment_id))
        }
        // Audited, logged as an error and counted by `receive`; the event itself is recorded.
        Received::ExtraCharge { payment_id, .. } => ("recorded", Some(payment_id)),
        Received::Unmatched => {
            tracing::info!(event_id = %event.id, event_type = %event.event_type, object = %event.reported.id(), "processor webhook about an object that is none of ours");
            ("unmatched", None)
        }
        Received::Duplicate => ("duplicate", None),
    };
    metrics::counter!("processor_webhooks_total", "outcome" => outcome).increment(1);
    let receipt = ProcessorWebhookReceipt { id: event.id, outcome: outcome.to_owned(), payment };
    Ok(Json(receipt).into_response())
}
