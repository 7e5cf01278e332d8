//! The answers a PaymentIntent call must not retry: a decline with the intent inside the error, a
//! refusal of the intent's state, and a success whose body the client cannot read.

use provider::{
    CardProcessor, DownstreamKey, ErrorClass, FrozenRequest, PaymentIntentRequest, ProcessorError,
    ReconcileCause, RefundRequest,
};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{client, fixture};

fn create() -> FrozenRequest {
    PaymentIntentRequest {
        payment_id: "pay_123".into(),
        amount: 500,
        currency: "usd".into(),
        payment_method: "pm_card_chargeDeclinedInsufficientFunds".into(),
        capture: true,
        description: None,
        metadata: Default::default(),
        return_url: "https://pay.example.com/return".into(),
    }
    .freeze(DownstreamKey::charge("pay_123"))
}

/// A server that answers every POST with `response`, and must be asked exactly once.
async fn answering_once(response: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(response).expect(1).mount(&server).await;
    server
}

#[tokio::test]
async fn a_decline_names_the_intent_it_left_behind_and_is_not_retried() {
    let server =
        answering_once(ResponseTemplate::new(402).set_body_json(fixture("error_402_declined")))
            .await;
    let err = client(&server).create_payment_intent(&create()).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Final);
    assert_eq!(
        err,
        ProcessorError::Declined {
            decline_code: "insufficient_funds".into(),
            message: "Your card has insufficient funds.".into(),
            charge_id: Some("ch_3Qdeclined00001".into()),
            payment_intent: Some("pi_3Qdeclined00001".into()),
        }
    );
}

#[tokio::test]
async fn a_decline_with_the_intent_as_an_id_or_without_one_reads_too() {
    let mut as_id = fixture("error_402_declined");
    as_id["error"]["payment_intent"] = "pi_only_the_id".into();
    let server = answering_once(ResponseTemplate::new(402).set_body_json(as_id)).await;
    let err = client(&server).create_payment_intent(&create()).await.unwrap_err();
    assert!(
        matches!(&err, ProcessorError::Declined { payment_intent: Some(id), .. } if id == "pi_only_the_id"),
        "{err:?}"
    );

    let bare = serde_json::json!({"error": {"type": "card_error", "message": "Declined."}});
    let server = answering_once(ResponseTemplate::new(402).set_body_json(bare)).await;
    let err = client(&server).create_payment_intent(&create()).await.unwrap_err();
    assert_eq!(
        err,
        ProcessorError::Declined {
            decline_code: "generic_decline".into(),
            message: "Declined.".into(),
            charge_id: None,
            payment_intent: None,
        }
    );
}

#[tokio::test]
async fn a_capture_the_intents_state_refuses_is_final_and_not_retried() {
    let body = fixture("error_400_unexpected_state");
    let server = answering_once(ResponseTemplate::new(400).set_body_json(body)).await;
    let capture = FrozenRequest::capture_intent(
        "pi_3Qcanceled00001",
        None,
        DownstreamKey::capture("pay_123", 7),
    );
    let err = client(&server).capture_payment_intent(&capture).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Final);
    assert!(
        matches!(&err, ProcessorError::Invalid { status: 400, code: Some(code), .. } if code == "payment_intent_unexpected_state"),
        "{err:?}"
    );
}

fn assert_unreadable(err: &ProcessorError) {
    assert_eq!(err.class(), ErrorClass::Reconcile, "{err:?}");
    assert!(
        matches!(
            err,
            ProcessorError::MustReconcile { cause: ReconcileCause::UnreadableAnswer, .. }
        ),
        "{err:?}"
    );
}

/// Bodies a 2xx may carry that do not read as a PaymentIntent (not JSON, JSON without a field
/// the code needs), each with whether it reads as a refund (which needs no status).
const UNREADABLE: [(&str, bool); 3] = [
    ("<html>gateway</html>", false),
    (r#"{"id": "pi_1", "object": "payment_intent", "amount": 500, "currency": "usd"}"#, true),
    (r#"{"id": "re_1", "object": "refund"}"#, false),
];

#[tokio::test]
async fn an_unreadable_success_of_any_intent_call_is_sent_once_and_reconciled() {
    for (body, a_refund) in UNREADABLE {
        let answer = || ResponseTemplate::new(200).set_body_string(body);
        let server = answering_once(answer()).await;
        assert_unreadable(&client(&server).create_payment_intent(&create()).await.unwrap_err());
        drop(server); // checks `.expect(1)`

        let key = || DownstreamKey::capture("pay_123", 7);
        let server = answering_once(answer()).await;
        let capture = FrozenRequest::capture_intent("pi_1", Some(300), key());
        assert_unreadable(&client(&server).capture_payment_intent(&capture).await.unwrap_err());
        drop(server);

        let server = answering_once(answer()).await;
        let cancel =
            FrozenRequest::cancel_intent("pi_1", None, DownstreamKey::cancel("pay_123", 8));
        assert_unreadable(&client(&server).cancel_payment_intent(&cancel).await.unwrap_err());
        drop(server);

        if a_refund {
            continue;
        }
        let server = answering_once(answer()).await;
        let refund = RefundRequest {
            charge_id: None,
            payment_intent: Some("pi_1".into()),
            payment_id: "pay_123".into(),
            refund_id: Some("re_9".into()),
            amount: None,
            reason: None,
        };
        let err = client(&server)
            .create_refund(&refund.freeze(DownstreamKey::refund("re_9")))
            .await
            .unwrap_err();
        assert_unreadable(&err);
    }
}

#[tokio::test]
async fn a_sparse_success_is_read_not_reconciled() {
    let server =
        answering_once(ResponseTemplate::new(200).set_body_json(fixture("payment_intent_sparse")))
            .await;
    let intent = client(&server).create_payment_intent(&create()).await.unwrap();
    assert_eq!(intent.id, "pi_sparse");
    assert!(intent.is_decided());
}
