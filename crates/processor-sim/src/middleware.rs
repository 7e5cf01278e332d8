//! The middleware every `/v1` request passes: it draws the request's fault plan from the
//! [`Injector`](crate::faults::Injector), lets an aimed rule that matches the request replace it
//! ([`AimedFaults`](crate::aimed::AimedFaults)), and carries it out (a delay, then a drop, an
//! injected 500 or 429, an answer lost after acting, or a 500 after processing), and names every
//! answer with a `Request-Id`, as Stripe does.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::Sim;
use crate::aimed::Aimed;
use crate::answer::plain_error;
use crate::faults::{ErrorAfterProcessing, Fault};

/// The largest body read here for an aimed rule's parameters (axum's own limit for a body).
const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Applies the fault plan of this request: delay, then drop, fail, or answer with nothing; and
/// names every answer with a `Request-Id`, as Stripe does.
pub(crate) async fn inject_faults(
    State(sim): State<Sim>,
    request: Request,
    next: Next,
) -> Response {
    let needs_params = sim.lock().aimed.needs_params(request.method(), request.uri().path());
    let (request, params) = if needs_params {
        match with_params(request).await {
            Ok(read) => read,
            Err(refused) => return refused,
        }
    } else {
        (request, Vec::new())
    };
    let (fault, delay, number) = {
        let mut inner = sim.lock();
        inner.ledger.stats.requests += 1;
        // The draw is made even when a rule fires, so that the drawn sequence depends only on the
        // seed and the order of requests.
        let drawn = inner.faults.plan();
        let (mut fault, delay) = inner.aimed.fire(&Aimed::of(&request, &params)).unwrap_or(drawn);
        // "500 after processing" is a fault of requests that act: a read has nothing to act on,
        // and is answered as usual (the draw is made all the same, to keep the sequence).
        if fault == Fault::ErrorAfterProcessing && request.method() != Method::POST {
            fault = Fault::None;
        }
        if fault != Fault::None {
            inner.ledger.stats.faults_injected += 1;
        }
        (fault, delay, inner.ledger.stats.requests)
    };
    let mut response = faulted(fault, delay, request, next).await;
    if let Ok(id) = HeaderValue::from_str(&format!("req_{number:014}")) {
        response.headers_mut().insert("request-id", id);
    }
    response
}

/// Reads the request's query and form parameters for the aimed rules, and gives the body back
/// to the request for its handler. A body that is not a form has no parameters (the handler
/// refuses it).
async fn with_params(request: Request) -> Result<(Request, Vec<(String, String)>), Response> {
    let (parts, body) = request.into_parts();
    let mut params: Vec<(String, String)> = parts
        .uri
        .query()
        .and_then(|query| serde_urlencoded::from_str(query).ok())
        .unwrap_or_default();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return Err(plain_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "The request body could not be read, or is larger than 2 MiB.",
        ));
    };
    if let Ok(form) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&bytes) {
        params.extend(form);
    }
    Ok((Request::from_parts(parts, Body::from(bytes)), params))
}

/// Carries out one fault plan around the request.
async fn faulted(fault: Fault, delay: Duration, mut request: Request, next: Next) -> Response {
    match fault {
        Fault::ErrorAfterProcessing => {
            // The POST executes and its handler answers the 500 (and keeps it against the key).
            request.extensions_mut().insert(ErrorAfterProcessing);
            let response = processed(request, next).await;
            pause(delay).await;
            response
        }
        Fault::None | Fault::LostResponse => {
            let response = processed(request, next).await;
            pause(delay).await;
            if fault == Fault::LostResponse { broken_answer() } else { response }
        }
        Fault::Drop => {
            pause(delay).await;
            broken_answer()
        }
        Fault::ServerError => {
            pause(delay).await;
            plain_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "An injected processor error.",
            )
        }
        Fault::RateLimit => {
            pause(delay).await;
            let mut response = plain_error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "Too many requests (injected).",
            );
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// Runs the request to the end, as at a real processor, even if the caller stops waiting: the
/// latency is in the answer's way back. So a caller that times out does not know whether the
/// charge happened; it did.
async fn processed(request: Request, next: Next) -> Response {
    match tokio::spawn(next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            plain_error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "The processor failed.")
        }
    }
}

async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// A response whose body fails at once: the connection breaks off, as if it had been reset.
fn broken_answer() -> Response {
    let stream = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by fault injection"))
    });
    Response::new(Body::from_stream(stream))
}
