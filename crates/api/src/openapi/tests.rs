//! The document: complete for every operation the router serves, 3.1, with every problem, and
//! with the schemas the API's answers need.

use std::collections::BTreeSet;

use serde_json::Value;

use super::*;
use crate::error::ProblemCode;

fn defaults() -> Settings {
    Settings::load_from(Vec::<(String, String)>::new()).unwrap_or_else(|err| panic!("{err}"))
}

fn rendered(settings: &Settings) -> Value {
    let (_, paths) = crate::app::api();
    let text = json(paths, settings, "http://127.0.0.1:1");
    serde_json::from_slice(&text).unwrap_or_else(|err| panic!("{err}"))
}

/// Every operation with its method and path template.
fn operations(document: &Value) -> Vec<(String, String, &Value)> {
    let mut all = Vec::new();
    for (path, item) in document["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            all.push((method.to_uppercase(), path.clone(), operation));
        }
    }
    all
}

/// The router and the document are made by the same `routes!` calls, so they cannot disagree on
/// what is served; this holds each operation's annotation to what the document promises.
#[test]
fn every_operation_the_router_serves_is_documented_in_full() {
    let document = rendered(&defaults());
    let operations = operations(&document);
    // `/metrics` is served by the admin listener, outside the API and its document.
    assert_eq!(operations.len(), 22, "{:?}", operations.iter().map(|o| &o.1).collect::<Vec<_>>());
    let mut ids = BTreeSet::new();
    for (method, path, operation) in &operations {
        let name = format!("{method} {path}");
        let id = operation["operationId"].as_str().unwrap_or_default();
        assert!(ids.insert(id.to_owned()), "{name}: operation id {id:?} missing or not unique");
        assert!(operation["summary"].is_string(), "{name} has no summary");
        assert_eq!(operation["tags"].as_array().map(Vec::len), Some(1), "{name}: one tag");
        let responses = operation["responses"].as_object().cloned().unwrap_or_default();
        assert!(responses.keys().any(|status| status.starts_with('2')), "{name}: no success");
        for (status, response) in &responses {
            let headers = response["headers"].as_object().cloned().unwrap_or_default();
            assert!(headers.contains_key("Request-Id"), "{name} {status} lacks Request-Id");
            for (header, described) in headers {
                assert!(
                    described["description"].as_str().is_some_and(|d| !d.is_empty()),
                    "{name} {status}: {header} is described nowhere (openapi/headers.rs)"
                );
            }
        }
        // An operation that takes an API key says so, and answers 401 without one.
        let secured = operation["security"].as_array().is_some_and(|s| !s.is_empty());
        assert_eq!(secured, responses.contains_key("401"), "{name}: security and 401 disagree");
        assert_eq!(secured, path.starts_with("/v1/"), "{name}: only /v1 takes an API key");
        // A required key and the problems of a keyed operation go together.
        let key = operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "Idempotency-Key");
        let required = key.is_some_and(|k| k["required"] == true);
        let missing = responses.get("400").is_some_and(|r| {
            r["description"].as_str().unwrap_or_default().contains("idempotency_key_missing")
        });
        assert_eq!(required, missing, "{name}: a required key and its 400 go together");
    }
    // Every schema the document refers to is in it.
    let text = document.to_string();
    for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap_or_default();
        assert!(document["components"]["schemas"][name].is_object(), "{name} is referred to");
    }
}

#[test]
#[should_panic(expected = "one `routes!` per path")]
fn handlers_of_two_paths_in_one_routes_call_are_refused() {
    use utoipa_axum::routes;

    #[utoipa::path(get, path = "/a", responses((status = 200, description = OK)))]
    async fn a() {}
    #[utoipa::path(post, path = "/b", responses((status = 200, description = OK)))]
    async fn b() {}

    let _ = ApiRouter::default().routes(routes!(a, b));
}

#[test]
fn the_document_is_openapi_3_1_with_every_problem_and_the_retention() {
    let mut settings = defaults();
    settings.idempotency.retention_hours = 36;
    let document = rendered(&settings);
    let text = document.to_string();
    assert!(document["openapi"].as_str().unwrap_or_default().starts_with("3.1"), "{document:#}");
    assert!(document["info"]["description"].as_str().unwrap_or_default().contains("36 hours"));
    assert_eq!(document["servers"][0]["url"], "http://127.0.0.1:1");
    let key = &document["paths"]["/v1/payments"]["post"]["parameters"][0];
    assert_eq!(key["name"], "Idempotency-Key");
    assert_eq!(key["required"], true);
    assert!(key["description"].as_str().unwrap_or_default().contains("36 hours"));
    assert!(!text.contains(param::RETENTION_HOURS), "the retention is filled in everywhere");
    for schema in ["Payment", "Refund", "CreatePaymentRequest", "CreateRefundRequest", "Problem"] {
        assert!(document["components"]["schemas"][schema].is_object(), "{schema} missing");
    }
    // Every problem code but the router's own 405 is answered by some operation.
    for code in ProblemCode::ALL {
        if code == ProblemCode::MethodNotAllowed {
            continue;
        }
        assert!(text.contains(&format!("(/problems/{code})")), "{code} is in no response");
    }
    let created = &document["paths"]["/v1/payments"]["post"]["responses"];
    assert!(created["201"]["headers"]["Idempotent-Replayed"].is_object());
    assert!(created["201"]["headers"]["Location"]["description"].is_string());
    assert!(created["402"]["headers"]["Idempotent-Replayed"].is_object(), "a stored decline");
    assert!(created["409"]["headers"]["Retry-After"].is_object());
    assert!(created["503"]["headers"]["Retry-After"].is_object());
    assert!(created["429"]["headers"]["Retry-After"].is_object());
    assert!(created["415"]["headers"]["Retry-After"].is_null());
    let listed = created["503"]["description"].as_str().unwrap_or_default();
    assert!(listed.contains("[`service_unavailable`](/problems/service_unavailable)"), "{listed}");
    assert!(listed.contains("[`processor_unavailable`](/problems/processor_unavailable)"));
}

#[test]
fn the_payment_schema_names_every_member_the_api_sends() {
    let document = rendered(&defaults());
    let payment = &document["components"]["schemas"]["Payment"]["properties"];
    let sample = serde_json::json!({
        "id": "pay_1", "object": "payment", "amount": 1, "currency": "usd",
        "status": "succeeded", "next_action": null, "capture_method": "automatic",
        "amount_captured": 1,
        "amount_refunded": 0, "refunded": false, "payment_method": "pm_card_visa",
        "description": null, "metadata": {}, "receipt_email": null,
        "processor_payment_intent_id": null, "processor_charge_id": null,
        "failure_code": null, "failure_message": null,
        "cancellation_reason": null, "created": 0, "livemode": false
    });
    for member in
        sample.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default()
    {
        assert!(payment[&member].is_object(), "Payment lacks {member}: {payment:#}");
    }
}

#[test]
fn an_optional_body_is_one_that_may_be_absent_not_null() {
    let document = rendered(&defaults());
    let capture = &document["paths"]["/v1/payments/{id}/capture"]["post"]["requestBody"];
    assert_eq!(capture["required"], false, "{capture:#}");
    let schema = &capture["content"]["application/json"]["schema"];
    assert_eq!(schema["$ref"], "#/components/schemas/CaptureBody", "{schema:#}");
    let create = &document["paths"]["/v1/payments"]["post"]["requestBody"];
    assert_eq!(create["required"], true, "{create:#}");
}

#[test]
fn the_delivery_log_is_documented_with_coarse_failures_and_no_timing() {
    let document = rendered(&defaults());
    let schemas = &document["components"]["schemas"];
    let attempts = &document["paths"]["/v1/webhook_endpoints/{id}/attempts"]["get"]["responses"];
    let list = &attempts["200"]["content"]["application/json"]["schema"];
    assert_eq!(list["$ref"], "#/components/schemas/WebhookAttemptList", "{list:#}");
    let attempt = &schemas["WebhookAttempt"]["properties"];
    assert!(attempt["duration_ms"].is_null(), "no timing is shown: {attempt:#}");
    let failure = schemas["WebhookFailure"].to_string();
    for class in ["timeout", "connection_refused", "tls_error", "refused_address", "http_status"] {
        assert!(failure.contains(&format!("\"{class}\"")), "{class}: {failure}");
    }
}

#[test]
fn the_event_operations_say_how_long_events_are_kept() {
    let mut settings = defaults();
    settings.retention.events_days = 45;
    let document = rendered(&settings);
    for (path, id) in [("/v1/events", "listEvents"), ("/v1/events/{id}", "retrieveEvent")] {
        let operation = &document["paths"][path]["get"];
        assert_eq!(operation["operationId"], id);
        let description =
            operation["description"].as_str().expect("the operation has a description");
        assert!(description.contains("45 days (`retention.events_days`"), "{description}");
    }
    assert!(!document.to_string().contains(param::EVENTS_DAYS), "filled in everywhere");
}
