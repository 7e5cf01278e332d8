//! A processor call's outcome as the phase after it records it: a final refusal as the problem
//! stored for it, a failure that is not final as an interruption, and how the outcome was learnt.

use idem::Interrupted;
use provider::ProcessorError;
use serde_json::Value;

use super::unavailable;
use crate::problems::{Problem, ProblemCode};

/// The final answer for a processor error that is final; `None` for one that is not.
pub(super) fn final_problem(err: &ProcessorError, payment_id: &str) -> Option<Problem> {
    match err {
        ProcessorError::Declined { decline_code, message, .. } => Some(
            Problem::new(ProblemCode::CardDeclined, message.clone())
                .with_extension("decline_code", decline_code.clone())
                .with_extension("payment_id", payment_id.to_owned()),
        ),
        ProcessorError::Invalid { param, message, .. } => {
            let problem = Problem::new(
                ProblemCode::InvalidRequest,
                format!("The card processor refused the request: {message}"),
            );
            Some(match param.as_deref() {
                Some("source") => problem.with_param("payment_method"),
                Some(other) => problem.with_param(other),
                None => problem,
            })
        }
        ProcessorError::Unavailable { .. }
        | ProcessorError::UnknownOutcome { .. }
        | ProcessorError::MustReconcile { .. } => None,
    }
}

/// A final refusal by the processor: its error, and the problem stored as the answer.
#[derive(Debug)]
pub(super) struct Refused {
    pub(super) err: ProcessorError,
    pub(super) problem: Problem,
}

/// A call's outcome as the last phase records it: what the call returned, or its final refusal;
/// a failure that is not final interrupts the step (the key stays at its recovery point).
pub(super) fn final_outcome<T>(
    outcome: Result<T, ProcessorError>,
    payment_id: &str,
) -> Result<Result<T, Refused>, Interrupted> {
    match outcome {
        Ok(made) => Ok(Ok(made)),
        Err(err) => match final_problem(&err, payment_id) {
            Some(problem) => Ok(Err(Refused { err, problem })),
            None => Err(unavailable(&err)),
        },
    }
}

/// How a call's outcome was learnt, for the audit record of the phase that records it: the
/// downstream key it went out under, and what reconciliation (or the processor's webhook) found
/// when that answered for the call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Learnt<'a> {
    pub(super) key: &'a provider::DownstreamKey,
    pub(super) reconciled: Option<&'a Value>,
}

pub(super) fn failure_code(err: &ProcessorError) -> String {
    match err {
        ProcessorError::Declined { decline_code, .. } => decline_code.clone(),
        ProcessorError::Invalid { code, .. } => {
            code.clone().unwrap_or_else(|| "processor_invalid_request".into())
        }
        ProcessorError::Unavailable { .. }
        | ProcessorError::UnknownOutcome { .. }
        | ProcessorError::MustReconcile { .. } => "processor_error".into(),
    }
}
