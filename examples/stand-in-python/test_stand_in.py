"""The stand-in as a pytest suite drives it, asserting with Stripe's own Python SDK."""

import pytest
import stripe

import payments


def test_a_payment_replayed_under_its_idempotency_key_is_the_same_payment():
    first = payments.create("pay_1", idempotency_key="key-1")
    again = payments.create("pay_1", idempotency_key="key-1")
    assert again.id == first.id
    assert again.last_response.headers.get("Idempotent-Replayed") == "true"


def test_a_lost_answer_is_retried_by_the_sdk_and_the_retry_gets_the_payment(sim):
    sim.aim(
        "lose_answer",
        method="POST",
        path=payments.CREATE_PATH,
        match={"idempotency_key": "key-lost"},
    )
    payment = payments.create("pay_2", idempotency_key="key-lost")
    # The first attempt made the payment and lost its answer; the SDK's retry, with the same key,
    # was answered from the key.
    assert payment.last_response.headers.get("Idempotent-Replayed") == "true"
    assert payment.metadata["payment_id"] == "pay_2"
    assert sim.stats()["payment_intents_created"] == 1
    assert sim.aimed() == [], "the rule fired once and is spent"


def test_a_500_after_processing_is_kept_and_the_retry_gets_the_same_500(sim):
    sim.aim("error_after_processing", path=payments.CREATE_PATH, match={"metadata": {"payment_id": "pay_3"}})
    with pytest.raises(stripe.APIError) as first:
        payments.create("pay_3", idempotency_key="key-500")
    assert first.value.http_status == 500
    with pytest.raises(stripe.APIError) as again:
        payments.create("pay_3", idempotency_key="key-500")
    assert again.value.http_status == 500
    assert again.value.headers.get("Idempotent-Replayed") == "true"
    assert sim.stats()["payment_intents_created"] == 1, "the payment behind the 500 was made once"


def test_a_key_reused_after_its_expiry_executes_again(sim):
    first = payments.create("pay_4", idempotency_key="key-expiring")
    sim.advance_clock(24 * 60 * 60 + 1)  # Stripe keeps a key for 24 hours
    again = payments.create("pay_4", idempotency_key="key-expiring")
    assert again.id != first.id
    assert again.created >= first.created + 24 * 60 * 60


def test_a_reset_forgets_the_payments_of_its_key_only(sim):
    mine = payments.create("pay_5")
    theirs = payments.create("pay_5", api_key="sk_test_another_suite")
    removed = sim.reset(api_key="sk_test_example_python")["removed"]
    assert (removed["payment_intents"], removed["charges"]) == (1, 1)
    with pytest.raises(stripe.InvalidRequestError) as missing:
        payments.retrieve(mine.id)
    assert missing.value.http_status == 404
    assert payments.retrieve(theirs.id, api_key="sk_test_another_suite").id == theirs.id
    assert sim.reset()["removed"]["payment_intents"] == 1


def test_a_3d_secure_payment_waits_for_the_customer_then_succeeds(sim):
    waiting = payments.create(
        "pay_6",
        idempotency_key="key-3ds",
        card="pm_card_threeDSecure2Required",
        return_url="https://shop.example/back",
    )
    assert waiting.status == "requires_action"
    assert waiting.next_action.type == "redirect_to_url"
    assert waiting.next_action.redirect_to_url.url.endswith(f"/_sim/authenticate/{waiting.id}")
    assert waiting.latest_charge is None
    # The customer completes the authentication on the stand-in's test page.
    assert sim.authenticate(waiting.id, "complete")["status"] == "succeeded"
    done = payments.retrieve(waiting.id)
    assert done.status == "succeeded"
    assert done.amount_received == 1000 and done.latest_charge.startswith("ch_")
