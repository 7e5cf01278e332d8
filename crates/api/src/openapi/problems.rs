//! The problem responses of an operation, from the problem catalogue (`ProblemCode`).
//!
//! An operation names its problems in its `#[utoipa::path]` as a type,
//! `Problems<Keyed, (code::CardDeclined, code::ProcessorUnavailable)>`: who may call it (which
//! brings the problems every such operation can answer) and the codes of its own. Each status
//! becomes one response that lists its codes with their titles, links their `/problems/{code}`
//! pages, and carries the headers those codes come with. The statuses and titles are the
//! catalogue's; nothing here re-types them.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::{Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, ToSchema};

use super::headers;
use super::schemas::Problem;
use crate::error::{PROBLEM_JSON, ProblemCode};

use ProblemCode as P;

/// The problem responses of an operation called by `A` that answers the codes `C` of its own
/// (a tuple of `code::…` types, or `()`).
#[derive(Debug)]
pub struct Problems<A, C = ()>(PhantomData<(A, C)>);

/// Who may call an operation, and so which problems it answers before any of its own.
pub trait Access {
    /// The problems answered before the operation's own, in the order the document lists them.
    const COMMON: &'static [&'static [ProblemCode]];
    /// Whether the operation requires an `Idempotency-Key`: a problem stored against the key is
    /// replayed with `Idempotent-Replayed`.
    const KEYED: bool;
}

/// Anyone: no API key (the probes, the document, the processor's signed webhooks).
#[derive(Debug)]
pub struct Public;

/// The holder of an API key.
#[derive(Debug)]
pub struct ApiKey;

/// The holder of an API key, with an `Idempotency-Key` that every request must carry.
#[derive(Debug)]
pub struct Keyed;

/// Problems any authenticated operation can answer.
const AUTHENTICATED: &[ProblemCode] = &[
    P::AuthenticationRequired,
    P::InvalidApiKey,
    P::RateLimited,
    P::InternalError,
    P::ServiceUnavailable,
];

/// Problems of every operation with a required key and a body, before and around the claim.
const KEYED: &[ProblemCode] = &[
    P::IdempotencyKeyMissing,
    P::IdempotencyKeyInvalid,
    P::IdempotencyKeyInUse,
    P::IdempotencyKeyReused,
    P::InvalidRequest,
    P::PayloadTooLarge,
    P::UnsupportedMediaType,
    P::ServiceUnavailable,
];

/// Problems any operation anyone may call can answer: its address's limit on requests without
/// an API key (`rate_limit.anonymous_per_second`).
const PUBLIC: &[ProblemCode] = &[P::RateLimited];

impl Access for Public {
    const COMMON: &'static [&'static [ProblemCode]] = &[PUBLIC];
    const KEYED: bool = false;
}

impl Access for ApiKey {
    const COMMON: &'static [&'static [ProblemCode]] = &[AUTHENTICATED];
    const KEYED: bool = false;
}

impl Access for Keyed {
    const COMMON: &'static [&'static [ProblemCode]] = &[AUTHENTICATED, KEYED];
    const KEYED: bool = true;
}

/// A problem code as a type, so that an annotation can name it.
pub trait Code {
    /// The code.
    const CODE: ProblemCode;
}

/// Problem codes as a tuple of `Code` types.
pub trait Codes {
    /// The codes, in order.
    const CODES: &'static [ProblemCode];
}

impl Codes for () {
    const CODES: &'static [ProblemCode] = &[];
}

macro_rules! codes_of_tuples {
    ($($first:ident $(, $rest:ident)*);+ $(;)?) => {$(
        impl<$first: Code $(, $rest: Code)*> Codes for ($first, $($rest,)*) {
            const CODES: &'static [ProblemCode] = &[$first::CODE $(, $rest::CODE)*];
        }
    )+};
}

codes_of_tuples!(
    A;
    A, B;
    A, B, C;
    A, B, C, D;
    A, B, C, D, E;
    A, B, C, D, E, F;
    A, B, C, D, E, F, G;
    A, B, C, D, E, F, G, H;
);

/// The catalogue's codes as types, for `Problems`: `code::CardDeclined` is
/// `ProblemCode::CardDeclined`.
pub mod code {
    use super::{Code, ProblemCode};

    macro_rules! code_types {
        ($($name:ident),+ $(,)?) => {$(
            #[doc = concat!("`ProblemCode::", stringify!($name), "`.")]
            #[derive(Debug)]
            pub struct $name;

            impl Code for $name {
                const CODE: ProblemCode = ProblemCode::$name;
            }
        )+};
    }

    code_types!(
        AmountTooLarge,
        CardDeclined,
        IdempotencyKeyInUse,
        IdempotencyKeyInvalid,
        IdempotencyKeyReused,
        InternalError,
        InvalidRequest,
        OperationNeedsReview,
        PayloadTooLarge,
        PaymentRequiresAction,
        PaymentUnexpectedState,
        PreconditionFailed,
        ProcessorUnavailable,
        ResourceMissing,
        ServiceUnavailable,
        UnsupportedMediaType,
    );
}

impl<A: Access, C: Codes> IntoResponses for Problems<A, C> {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut by_status: BTreeMap<u16, Vec<ProblemCode>> = BTreeMap::new();
        for code in A::COMMON.iter().copied().flatten().chain(C::CODES) {
            let codes = by_status.entry(code.status()).or_default();
            if !codes.contains(code) {
                codes.push(*code);
            }
        }
        by_status
            .into_iter()
            .map(|(status, codes)| (status.to_string(), RefOr::T(response(&codes, A::KEYED))))
            .collect()
    }
}

/// One status's response: its codes, the problem schema, and the headers its codes come with.
fn response(codes: &[ProblemCode], keyed: bool) -> Response {
    let listed: Vec<String> =
        codes.iter().map(|c| format!("[`{c}`](/problems/{c}): {}", c.title())).collect();
    let mut response = ResponseBuilder::new().description(listed.join("; ")).content(
        PROBLEM_JSON,
        ContentBuilder::new().schema(Some(Ref::from_schema_name(Problem::name()))).build(),
    );
    if codes.iter().any(|c| crate::error::retry_after_seconds(*c).is_some()) {
        response = response.header("Retry-After", headers::retry_after());
    }
    if keyed && codes.iter().any(|c| stored_for_replay(*c)) {
        response = response.header("Idempotent-Replayed", headers::idempotent_replayed());
    }
    response.build()
}

/// Whether the catalogue says a problem of this code is stored against the key and replayed.
fn stored_for_replay(code: ProblemCode) -> bool {
    code.doc().stored_for_replay.to_ascii_lowercase().starts_with("yes")
}
