//! The parameters of `POST /v1/payment_intents` and `…/confirm`, checked before the operation
//! begins (a refusal here keeps nothing against the idempotency key, as at Stripe).

use super::super::{amount, param};
use super::CaptureMethod;
use crate::answer::Answer;

/// A `true`/`false` parameter, if sent; anything else is refused before the operation begins.
fn boolean(params: &[(String, String)], name: &str) -> Result<Option<bool>, Answer> {
    match param(params, name) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(_) => Err(Answer::bad_param("parameter_invalid", Some(name), "Invalid boolean.")),
    }
}

/// `return_url`, if sent: it must be an http(s) URL.
pub(super) fn return_url(params: &[(String, String)]) -> Result<Option<String>, Answer> {
    match param(params, "return_url") {
        None => Ok(None),
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
            Ok(Some(url.to_owned()))
        }
        Some(_) => Err(Answer::bad_param("url_invalid", Some("return_url"), "Not a valid URL")),
    }
}

/// `allowed_payment_method_types[]` (the pinned API version's name) or `payment_method_types[]`
/// (older versions'), each also as `…[0]`, as the SDKs send lists, if sent (not both). The
/// stand-in's payment methods are cards.
fn payment_method_types(params: &[(String, String)]) -> Result<Option<Vec<String>>, Answer> {
    let named = |prefix: &str| -> Vec<String> {
        params.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v.clone()).collect()
    };
    let (allowed, older) = (named("allowed_payment_method_types["), named("payment_method_types["));
    let types = match (allowed.is_empty(), older.is_empty()) {
        (true, true) => return Ok(None),
        (false, true) => allowed,
        (true, false) => older,
        (false, false) => {
            let message = "You may only specify one of these parameters: \
                           allowed_payment_method_types, payment_method_types.";
            let param = Some("payment_method_types");
            return Err(Answer::bad_param("parameter_invalid", param, message));
        }
    };
    if let Some(other) = types.iter().find(|t| t.as_str() != "card") {
        let message = format!("The payment method type \"{other}\" is invalid.");
        return Err(Answer::bad_param("parameter_invalid", Some("payment_method_types"), &message));
    }
    Ok(Some(types))
}

/// Stripe's refusal to confirm, with automatic payment methods that may redirect, without a
/// `return_url` to come back to.
pub(super) fn return_url_required() -> Answer {
    Answer::bad_param(
        "parameter_missing",
        Some("return_url"),
        "This PaymentIntent is configured to accept payment methods enabled in your Dashboard. \
         Because some of these payment methods might redirect your customer off of your page, \
         you must provide a `return_url`. If you don't want to accept redirect-based payment \
         methods, set `automatic_payment_methods[enabled]` to `true` and \
         `automatic_payment_methods[allow_redirects]` to `never` when creating Setup Intents and \
         Payment Intents.",
    )
}

/// The parameters of a create, checked before anything happens.
pub(super) struct CreateParams {
    pub amount: i64,
    pub currency: String,
    pub capture_method: CaptureMethod,
    pub confirm: bool,
    /// `Some`: automatic payment methods are on, with this `allow_redirects`.
    pub allow_redirects: Option<&'static str>,
    pub payment_method_types: Option<Vec<String>>,
    pub payment_method: Option<String>,
    pub return_url: Option<String>,
}

pub(super) fn create_params(params: &[(String, String)]) -> Result<CreateParams, Answer> {
    let Some(amount) = amount(params, "amount")? else {
        let message = "Missing required param: amount.";
        return Err(Answer::bad_param("parameter_missing", Some("amount"), message));
    };
    let currency = match param(params, "currency") {
        Some(c) if c.len() == 3 && c.bytes().all(|b| b.is_ascii_lowercase()) => c.to_owned(),
        None => {
            let message = "Missing required param: currency.";
            return Err(Answer::bad_param("parameter_missing", Some("currency"), message));
        }
        Some(_) => {
            return Err(Answer::bad_param(
                "parameter_invalid",
                Some("currency"),
                "Invalid currency.",
            ));
        }
    };
    let capture_method = match param(params, "capture_method").map(CaptureMethod::parse) {
        None => CaptureMethod::Automatic,
        Some(Some(method)) => method,
        Some(None) => {
            let message = "Invalid capture_method: must be one of automatic, automatic_async, \
                           or manual";
            return Err(Answer::bad_param("parameter_invalid", Some("capture_method"), message));
        }
    };
    let confirm = boolean(params, "confirm")?.unwrap_or(false);
    let enabled = boolean(params, "automatic_payment_methods[enabled]")?;
    let payment_method_types = payment_method_types(params)?;
    let return_url = return_url(params)?;
    let allow_redirects = match param(params, "automatic_payment_methods[allow_redirects]") {
        None | Some("always") => "always",
        Some("never") => "never",
        Some(_) => {
            let name = "automatic_payment_methods[allow_redirects]";
            return Err(Answer::bad_param("parameter_invalid", Some(name), "Invalid value."));
        }
    };
    if payment_method_types.is_some() && enabled == Some(true) {
        let message = "You may only specify one of these parameters: automatic_payment_methods, \
                       payment_method_types.";
        return Err(Answer::bad_param("parameter_invalid", Some("payment_method_types"), message));
    }
    // Stripe's current versions turn automatic payment methods on unless told which types.
    let allow_redirects = payment_method_types.is_none().then_some(allow_redirects);
    if confirm && allow_redirects == Some("always") && return_url.is_none() {
        return Err(return_url_required());
    }
    let payment_method = param(params, "payment_method").map(str::to_owned);
    Ok(CreateParams {
        amount,
        currency,
        capture_method,
        confirm,
        allow_redirects,
        payment_method_types,
        payment_method,
        return_url,
    })
}
