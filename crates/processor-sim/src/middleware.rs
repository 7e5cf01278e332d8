//! The middleware every `/v1` request passes: it draws the request's fault plan from the
//! [`Injector`](crate::faults::Injector) and carries it out (a delay, then a drop, an injected 500
//! or 429, an answer lost after acting, or a 500 after processing), and names every answer with
//! a `Request-Id`, as Stripe does.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::Sim;
use crate::answer::plain_error;
use crate::faults::{ErrorAfterProcessing, Fault};

/// Applies the fault plan of this request: delay, then drop, fail, or answer with nothing; and
/// names every answer with a `Request-Id`, as Stripe does.
pub(crate) async fn inject_faults(
    State(sim): State<Sim>,
    request: Request,
    next: Next,
) -> Response {
    let (fault, delay, number) = {
        let mut inner = sim.lock();
        inner.ledger.stats.requests += 1;
        let (mut fault, delay) = inner.faults.plan();
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
