//! The stored answers of the operations: a payment, a refund, a problem.

use idem::StoredResponse;

use crate::payments::Payment;
use crate::problems::{PROBLEM_JSON, Problem};
use crate::refunds::Refund;

/// A payment as a stored answer, with its ETag (and `Location` when it was created).
pub fn payment_answer(status: u16, payment: &Payment, created: bool) -> StoredResponse {
    let body = payment.to_json();
    let etag = Payment::etag_of(&body);
    let answer = StoredResponse::json(status, body).with_header("etag", etag);
    if created {
        answer.with_header("location", format!("/v1/payments/{}", payment.id))
    } else {
        answer
    }
}

pub(super) fn refund_answer(refund: &Refund) -> StoredResponse {
    StoredResponse::json(201, refund.to_json())
        .with_header("location", format!("/v1/refunds/{}", refund.id))
}

/// A problem as a stored answer, its `instance` the first request's id.
pub(crate) fn problem_answer(
    problem: &Problem,
    request_id: &str,
    public_base_url: &str,
) -> StoredResponse {
    StoredResponse {
        status: problem.code.status(),
        headers: vec![("content-type".into(), PROBLEM_JSON.into())],
        body: problem.render(request_id, public_base_url),
    }
}
