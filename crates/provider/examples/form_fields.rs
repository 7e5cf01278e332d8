//! Prints, as JSON, the top-level parameter names of the form each money-moving call of the
//! provider sends: the PaymentIntent create-and-confirm, its capture, its cancel, and a refund by
//! PaymentIntent. Each form is built by the real constructors (`PaymentIntentRequest::freeze`,
//! `FrozenRequest::capture_intent`, `FrozenRequest::cancel_intent`, `RefundRequest::freeze`)
//! with every optional field set, so every name the provider can send shows. A bracketed name
//! counts as its top-level parameter: `metadata[payment_id]` is `metadata`,
//! `payment_method_types[0]` is `payment_method_types`.
//!
//! Stripe's official SDKs judge the names (`scripts/stripe-sdk.sh`: the Python and Node suites
//! compare them with the parameters each SDK documents for the endpoint):
//!
//! ```text
//! cargo run -p provider --example form_fields
//! {"payment_intent_create": {"method": "POST", "path": "/v1/payment_intents",
//!   "params": ["amount", "currency", …]}, …}
//! ```

use std::collections::BTreeMap;

use provider::{DownstreamKey, FrozenRequest, PaymentIntentRequest, RefundRequest};
use serde_json::{Value, json};

/// The sample PaymentIntent the forms act on; it stands for `{intent}` in the printed paths.
const INTENT: &str = "pi_sample";

/// The top-level parameter names of a form, each once, in the order first sent.
fn top_level_names(request: &FrozenRequest) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (name, _value) in &request.form {
        let top = name.split('[').next().unwrap_or(name).to_owned();
        if !names.contains(&top) {
            names.push(top);
        }
    }
    names
}

/// One call as printed: its method, its path with the sample intent as `{intent}`, its names.
fn call(request: &FrozenRequest) -> Value {
    json!({
        "method": "POST",
        "path": request.path.replace(INTENT, "{intent}"),
        "params": top_level_names(request),
    })
}

fn main() {
    let create = PaymentIntentRequest {
        payment_id: "pay_sample".to_owned(),
        amount: 500,
        currency: "usd".to_owned(),
        payment_method: "pm_card_visa".to_owned(),
        capture: false,
        description: Some("Two books".to_owned()),
        metadata: BTreeMap::from([("release".to_owned(), "42".to_owned())]),
        return_url: "https://pay.example.com/return".to_owned(),
    }
    .freeze(DownstreamKey::charge("pay_sample"));
    let capture =
        FrozenRequest::capture_intent(INTENT, Some(300), DownstreamKey::capture("pay_sample", 1));
    let cancel = FrozenRequest::cancel_intent(
        INTENT,
        Some("requested_by_customer"),
        DownstreamKey::cancel("pay_sample", 2),
    );
    let refund = RefundRequest {
        charge_id: None,
        payment_intent: Some(INTENT.to_owned()),
        payment_id: "pay_sample".to_owned(),
        refund_id: Some("re_sample".to_owned()),
        amount: Some(200),
        reason: Some("requested_by_customer".to_owned()),
    }
    .freeze(DownstreamKey::refund("re_sample"));
    let calls = json!({
        "payment_intent_create": call(&create),
        "payment_intent_capture": call(&capture),
        "payment_intent_cancel": call(&cancel),
        "refund_create": call(&refund),
    });
    println!("{calls:#}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bracketed_names_count_once_as_their_top_level_name() {
        let request = FrozenRequest {
            path: "/v1/x".to_owned(),
            form: vec![
                ("amount".to_owned(), "1".to_owned()),
                ("metadata[a]".to_owned(), "1".to_owned()),
                ("payment_method_types[0]".to_owned(), "card".to_owned()),
                ("metadata[b]".to_owned(), "2".to_owned()),
            ],
            key: DownstreamKey::charge("pay_1"),
        };
        assert_eq!(top_level_names(&request), ["amount", "metadata", "payment_method_types"]);
    }
}
