"""Stripe's own Python SDK against the stand-in processor (`processor-sim`).

Every endpoint the stand-in serves is called the way an application calls Stripe: through
`stripe.Charge`, `stripe.PaymentIntent`, `stripe.Refund` and their list, search and paging
helpers, with the SDK's own retries on; a 3-D Secure authentication is completed or failed through
the stand-in's control route, as a customer would on Stripe's test page. One more check needs no
stand-in: the form fields of each call the provider makes (`--form-fields`, the JSON of
`cargo run -p provider --example form_fields`) must be parameters that the SDK documents for that
endpoint (its typed params, found from the SDK's own method for the path). Each check is a function
named `check_…`; the script runs them all in order against one fresh stand-in and ends with
`N passed, M failed`, exiting non-zero if any failed.

    python test_stand_in.py --bin target/debug/processor-sim   # starts it on a free port
    python test_stand_in.py --url http://127.0.0.1:12111       # uses one already running
    python test_stand_in.py --bin ... --form-fields target/provider-form-fields.json

`scripts/stripe-sdk.sh` (`make stripe-sdk`) installs the pinned SDK into a venv and runs this.
"""

import argparse
import http.server
import inspect
import json
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import traceback
import typing
import urllib.request
import uuid

import stripe
import stripe.params
from stripe._request_options import RequestOptions

API_KEY = "sk_test_stripe_sdk"
# A prefix that no earlier run can have used, so that search and lists see only this run's
# charges even against a stand-in that was already running.
RUN = uuid.uuid4().hex[:12]


def sim_request(method, path, body=None):
    """A call to the stand-in's own control surface (`/_sim/...`), outside the SDK."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        stripe.api_base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def set_faults(faults):
    sim_request("PUT", "/_sim/faults", faults)


def stats():
    return sim_request("GET", "/_sim/stats")


def visa(payment_id, **extra):
    """Parameters of a 1000-cent charge on the test Visa card, tagged with `payment_id`."""
    params = {
        "amount": 1000,
        "currency": "usd",
        "source": "pm_card_visa",
        "metadata": {"payment_id": payment_id, "run": RUN},
    }
    params.update(extra)
    return params


def check_a_charge_with_an_idempotency_key_is_replayed_with_the_same_id():
    key = f"{RUN}-replay"
    first = stripe.Charge.create(idempotency_key=key, **visa(f"pay_{RUN}_1"))
    assert first.object == "charge" and first.id.startswith("ch_"), first
    assert first.paid and first.captured and first.status == "succeeded", first
    assert first.metadata["payment_id"] == f"pay_{RUN}_1"
    assert first.last_response.request_id.startswith("req_")
    again = stripe.Charge.create(idempotency_key=key, **visa(f"pay_{RUN}_1"))
    assert again.id == first.id, (again.id, first.id)
    assert again.last_response.headers["Idempotent-Replayed"] == "true"


def check_a_key_reused_with_other_parameters_raises_idempotency_error():
    key = f"{RUN}-mismatch"
    stripe.Charge.create(idempotency_key=key, **visa(f"pay_{RUN}_2"))
    try:
        stripe.Charge.create(idempotency_key=key, **visa(f"pay_{RUN}_2", amount=1001))
    except stripe.IdempotencyError as err:
        assert err.http_status == 400, err.http_status
        assert f"a key other than '{key}'" in err.user_message, err.user_message
    else:
        raise AssertionError("no IdempotencyError")
    assert issubclass(stripe.error.IdempotencyError, stripe.StripeError)


def check_a_declined_card_raises_card_error_with_its_decline_code():
    params = visa(f"pay_{RUN}_3", source="pm_card_chargeDeclined")
    try:
        stripe.Charge.create(idempotency_key=f"{RUN}-decline", **params)
    except stripe.CardError as err:
        assert err.http_status == 402, err.http_status
        assert err.code == "card_declined", err.code
        assert err.error.decline_code == "generic_decline", err.error
        assert err.error.charge.startswith("ch_"), err.error
    else:
        raise AssertionError("no CardError")


def check_a_declined_charge_carries_its_error_code_and_its_outcome():
    """As on Stripe: the charge's `failure_code` is the error's code, `outcome.reason` the
    decline code; a successful charge has an outcome without a reason."""
    params = visa(f"pay_{RUN}_if", source="pm_card_chargeDeclinedInsufficientFunds")
    try:
        stripe.Charge.create(idempotency_key=f"{RUN}-insufficient", **params)
    except stripe.CardError as err:
        assert (err.code, err.error.decline_code) == ("card_declined", "insufficient_funds"), err.error
        charge, message = stripe.Charge.retrieve(err.error.charge), err.user_message
    else:
        raise AssertionError("no CardError")
    assert charge.status == "failed" and not charge.paid, charge
    assert charge.failure_code == "card_declined", charge
    assert charge.failure_message == message, (charge.failure_message, message)
    assert charge.outcome.reason == "insufficient_funds", charge.outcome
    assert charge.outcome.type == "issuer_declined", charge.outcome
    assert charge.outcome.network_status == "declined_by_network", charge.outcome
    assert charge.outcome.seller_message, charge.outcome
    paid = stripe.Charge.create(idempotency_key=f"{RUN}-authorized", **visa(f"pay_{RUN}_ok"))
    assert paid.failure_code is None and paid.outcome.reason is None, paid
    assert (paid.outcome.type, paid.outcome.network_status) == ("authorized", "approved_by_network")


def check_an_authorization_is_captured_refunded_and_retrieved():
    authorized = stripe.Charge.create(
        idempotency_key=f"{RUN}-auth", **visa(f"pay_{RUN}_4", capture=False)
    )
    assert not authorized.captured and authorized.amount_captured == 0, authorized
    captured = stripe.Charge.capture(authorized.id, idempotency_key=f"{RUN}-capture")
    assert captured.id == authorized.id and captured.captured, captured
    assert captured.amount_captured == 1000, captured
    refund = stripe.Refund.create(
        idempotency_key=f"{RUN}-refund",
        charge=authorized.id,
        amount=300,
        metadata={"refund_id": f"re_{RUN}_1"},
    )
    assert refund.object == "refund" and refund.id.startswith("re_"), refund
    assert (refund.charge, refund.amount) == (authorized.id, 300), refund
    assert refund.metadata["refund_id"] == f"re_{RUN}_1"
    retrieved = stripe.Charge.retrieve(authorized.id)
    assert retrieved.amount_refunded == 300 and not retrieved.refunded, retrieved


def check_a_charges_refunds_are_listed_by_charge():
    charge = stripe.Charge.create(idempotency_key=f"{RUN}-refunded", **visa(f"pay_{RUN}_5"))
    made = [
        stripe.Refund.create(idempotency_key=f"{RUN}-r{n}", charge=charge.id, amount=100).id
        for n in range(3)
    ]
    listed = stripe.Refund.list(charge=charge.id, limit=2)
    assert listed.object == "list" and listed.has_more, listed
    every = [refund.id for refund in listed.auto_paging_iter()]
    assert every == made[::-1], (every, made)


def check_charges_are_listed_page_by_page_with_auto_paging():
    before = {charge.id for charge in stripe.Charge.list(limit=100).auto_paging_iter()}
    made = [
        stripe.Charge.create(idempotency_key=f"{RUN}-list{n}", **visa(f"pay_{RUN}_l{n}")).id
        for n in range(5)
    ]
    first_page = stripe.Charge.list(limit=2)
    assert len(first_page.data) == 2 and first_page.has_more, first_page
    every = [charge.id for charge in stripe.Charge.list(limit=2).auto_paging_iter()]
    assert len(every) == len(set(every)), "no charge twice"
    assert every[:5] == made[::-1], "newest first"
    assert set(every) == before | set(made), "every charge once"


def check_charges_are_found_by_search_page_by_page():
    order = f"order_{RUN}"
    made = [
        stripe.Charge.create(
            idempotency_key=f"{RUN}-search{n}",
            **visa(f"pay_{RUN}_s{n}", metadata={"payment_id": f"pay_{RUN}_s{n}", "order": order}),
        ).id
        for n in range(3)
    ]
    one = stripe.Charge.search(query=f"metadata['payment_id']:'pay_{RUN}_s1'")
    assert one.object == "search_result", one
    assert [charge.id for charge in one.data] == [made[1]], one
    page = stripe.Charge.search(query=f"metadata['order']:'{order}'", limit=1)
    assert page.has_more and page.next_page, page
    every = [charge.id for charge in page.auto_paging_iter()]
    assert every == made[::-1], (every, made)
    both = stripe.Charge.search(
        query=f"metadata['order']:'{order}' AND metadata['payment_id']:'pay_{RUN}_s2'"
    )
    assert [charge.id for charge in both.data] == [made[2]], both
    try:
        stripe.Charge.search(query="amount>100")
    except stripe.InvalidRequestError as err:
        assert err.http_status == 400 and err.param == "query", err
    else:
        raise AssertionError("no InvalidRequestError")


def check_a_500_after_processing_is_replayed_and_not_retried_by_the_sdk():
    key = f"{RUN}-after"
    set_faults({"error_after_processing_rate": 1.0})
    try:
        requests_before = stats()["requests"]
        try:
            stripe.Charge.create(idempotency_key=key, **visa(f"pay_{RUN}_6"))
        except stripe.APIError as err:
            assert err.http_status == 500, err.http_status
        else:
            raise AssertionError("no APIError")
        # Stripe-Should-Retry: false, as Stripe sends with a 500 it will replay: one request,
        # though the SDK may retry twice.
        assert stats()["requests"] == requests_before + 1
    finally:
        set_faults({})
    created = stats()["charges_created"]
    try:
        stripe.Charge.create(idempotency_key=key, **visa(f"pay_{RUN}_6"))
    except stripe.APIError as err:
        assert err.headers["Idempotent-Replayed"] == "true", err.headers
    else:
        raise AssertionError("the kept 500 was not replayed")
    assert stats()["charges_created"] == created, "no second charge"
    found = stripe.Charge.search(query=f"metadata['payment_id']:'pay_{RUN}_6'")
    assert len(found.data) == 1, "the charge behind the 500 exists"


def check_webhooks_verify_with_construct_event_and_carry_the_charge_and_its_key():
    """The stand-in's webhooks, as `stripe.Webhook.construct_event` verifies them."""
    secret = f"whsec_{RUN}"
    received = queue.Queue()

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            payload = self.rfile.read(int(self.headers["Content-Length"]))
            received.put((payload, self.headers["Stripe-Signature"]))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    sim_request("PUT", "/_sim/webhooks", {"url": url, "secret": secret})
    try:
        key = f"{RUN}-webhook"
        charge = stripe.Charge.create(idempotency_key=key, **visa(f"pay_{RUN}_7"))
        payload, header = received.get(timeout=10)
        event = stripe.Webhook.construct_event(payload, header, secret)
        assert event.type == "charge.succeeded", event.type
        assert event.data.object.id == charge.id
        assert event.request.idempotency_key == key
        try:
            stripe.Webhook.construct_event(payload, header, "whsec_not_the_secret")
        except stripe.SignatureVerificationError:
            pass
        else:
            raise AssertionError("a wrong secret verified")
    finally:
        sim_request("PUT", "/_sim/webhooks", None)
        server.shutdown()


def card_intent(payment_id, **extra):
    """Parameters of a 1000-cent card-only PaymentIntent, tagged with `payment_id`."""
    params = {
        "amount": 1000,
        "currency": "usd",
        "payment_method_types": ["card"],
        "metadata": {"payment_id": payment_id, "run": RUN},
    }
    params.update(extra)
    return params


def check_a_payment_intent_is_created_then_confirmed_with_a_charge_under_it():
    payment_id = f"pay_{RUN}_pi1"
    intent = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-create", **card_intent(payment_id, payment_method="pm_card_visa")
    )
    assert intent.object == "payment_intent" and intent.id.startswith("pi_"), intent
    assert intent.status == "requires_confirmation" and intent.latest_charge is None, intent
    assert intent.client_secret.startswith(intent.id + "_secret_"), intent.client_secret
    confirmed = stripe.PaymentIntent.confirm(intent.id, idempotency_key=f"{RUN}-pi-confirm")
    assert confirmed.status == "succeeded" and confirmed.amount_received == 1000, confirmed
    charge = stripe.Charge.retrieve(confirmed.latest_charge)
    assert charge.payment_intent == intent.id and charge.captured, charge
    assert charge.metadata["payment_id"] == payment_id, charge.metadata
    assert stripe.PaymentIntent.retrieve(intent.id).status == "succeeded"
    one_call = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-one-call",
        **card_intent(f"pay_{RUN}_pi1b", payment_method="pm_card_mastercard", confirm=True),
    )
    assert one_call.status == "succeeded", one_call


def check_a_declined_confirmation_raises_card_error_with_the_intent_inside():
    params = card_intent(f"pay_{RUN}_pi2", payment_method="pm_card_chargeDeclinedInsufficientFunds")
    try:
        stripe.PaymentIntent.create(idempotency_key=f"{RUN}-pi-decline", confirm=True, **params)
    except stripe.error.CardError as err:
        assert err.http_status == 402, err.http_status
        assert err.code == "card_declined", err.code
        assert err.error.decline_code == "insufficient_funds", err.error
        intent = err.error.payment_intent
        assert intent.status == "requires_payment_method", intent
        assert intent.last_payment_error.code == "card_declined", intent.last_payment_error
        assert intent.latest_charge == err.error.charge, (intent.latest_charge, err.error.charge)
    else:
        raise AssertionError("no CardError")
    assert stripe.Charge.retrieve(intent.latest_charge).status == "failed"
    again = stripe.PaymentIntent.confirm(
        intent.id, payment_method="pm_card_visa", idempotency_key=f"{RUN}-pi-decline-retry"
    )
    assert again.status == "succeeded" and again.last_payment_error is None, again


def authenticate(intent_id, outcome):
    """Completes or fails a pending 3-D Secure authentication, as Stripe's test page does."""
    path = f"/_sim/payment_intents/{intent_id}/authenticate"
    return sim_request("POST", path, {"outcome": outcome})


def check_an_authentication_completed_at_the_stand_in_makes_the_payment_succeed():
    intent = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-3ds",
        confirm=True,
        return_url="https://shop.example/back",
        **card_intent(f"pay_{RUN}_pi3", payment_method="pm_card_authenticationRequired"),
    )
    assert intent.status == "requires_action", intent
    assert intent.next_action.type == "redirect_to_url", intent.next_action
    assert intent.next_action.redirect_to_url.url.endswith(f"/_sim/authenticate/{intent.id}")
    assert intent.next_action.redirect_to_url.return_url == "https://shop.example/back"
    assert intent.latest_charge is None, intent
    assert authenticate(intent.id, "complete")["status"] == "succeeded"
    done = stripe.PaymentIntent.retrieve(intent.id)
    assert done.status == "succeeded" and done.latest_charge.startswith("ch_"), done
    replayed = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-3ds",
        confirm=True,
        return_url="https://shop.example/back",
        **card_intent(f"pay_{RUN}_pi3", payment_method="pm_card_authenticationRequired"),
    )
    assert replayed.status == "requires_action", "the key keeps the answer it gave"
    assert replayed.last_response.headers["Idempotent-Replayed"] == "true"


def check_an_authentication_failed_at_the_stand_in_asks_for_another_payment_method():
    intent = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-3ds-fail",
        confirm=True,
        **card_intent(f"pay_{RUN}_pi4", payment_method="pm_card_threeDSecure2Required"),
    )
    assert intent.status == "requires_action", intent
    assert intent.next_action.type == "use_stripe_sdk", intent.next_action
    authenticate(intent.id, "fail")
    failed = stripe.PaymentIntent.retrieve(intent.id)
    assert failed.status == "requires_payment_method" and failed.latest_charge is None, failed
    assert failed.last_payment_error.code == "payment_intent_authentication_failure", failed


def check_a_manual_capture_takes_the_whole_authorization():
    intent = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-manual",
        confirm=True,
        capture_method="manual",
        **card_intent(f"pay_{RUN}_pi5", payment_method="pm_card_visa"),
    )
    assert intent.status == "requires_capture" and intent.amount_capturable == 1000, intent
    captured = stripe.PaymentIntent.capture(intent.id, idempotency_key=f"{RUN}-pi-capture")
    assert captured.status == "succeeded" and captured.amount_received == 1000, captured
    try:
        stripe.PaymentIntent.capture(intent.id, idempotency_key=f"{RUN}-pi-capture-again")
    except stripe.InvalidRequestError as err:
        assert err.code == "payment_intent_unexpected_state", err.code
    else:
        raise AssertionError("captured twice")


def check_a_partial_capture_releases_the_rest():
    intent = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-partial",
        confirm=True,
        capture_method="manual",
        **card_intent(f"pay_{RUN}_pi6", payment_method="pm_card_visa"),
    )
    captured = stripe.PaymentIntent.capture(
        intent.id, amount_to_capture=600, idempotency_key=f"{RUN}-pi-partial-capture"
    )
    assert captured.status == "succeeded" and captured.amount_received == 600, captured
    charge = stripe.Charge.retrieve(captured.latest_charge)
    assert (charge.amount_captured, charge.amount_refunded) == (600, 400), charge


def check_an_intent_is_canceled_and_its_authorization_released():
    intent = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-cancel",
        confirm=True,
        capture_method="manual",
        **card_intent(f"pay_{RUN}_pi7", payment_method="pm_card_visa"),
    )
    canceled = stripe.PaymentIntent.cancel(
        intent.id, cancellation_reason="requested_by_customer", idempotency_key=f"{RUN}-pi-cancel-1"
    )
    assert canceled.status == "canceled" and canceled.cancellation_reason == "requested_by_customer"
    assert stripe.Charge.retrieve(intent.latest_charge).refunded
    try:
        stripe.PaymentIntent.cancel(intent.id, idempotency_key=f"{RUN}-pi-cancel-2")
    except stripe.InvalidRequestError as err:
        assert err.code == "payment_intent_unexpected_state", err.code
        assert err.error.payment_intent.status == "canceled", err.error
    else:
        raise AssertionError("canceled twice")


def check_a_refund_by_payment_intent_refunds_its_charge():
    intent = stripe.PaymentIntent.create(
        idempotency_key=f"{RUN}-pi-refund",
        confirm=True,
        **card_intent(f"pay_{RUN}_pi8", payment_method="pm_card_visa"),
    )
    made = [
        stripe.Refund.create(
            idempotency_key=f"{RUN}-pi-refund{n}", payment_intent=intent.id, amount=100
        ).id
        for n in range(3)
    ]
    listed = stripe.Refund.list(payment_intent=intent.id, limit=2)
    every = [r.id for r in listed.auto_paging_iter()]
    assert every == made[::-1], (every, made)
    for refund in listed.data:
        assert (refund.payment_intent, refund.charge) == (intent.id, intent.latest_charge), refund
    assert stripe.Charge.retrieve(intent.latest_charge).amount_refunded == 300


def check_payment_intents_are_listed_page_by_page_with_auto_paging():
    before = {intent.id for intent in stripe.PaymentIntent.list(limit=100).auto_paging_iter()}
    made = [
        stripe.PaymentIntent.create(
            idempotency_key=f"{RUN}-pi-list{n}", **card_intent(f"pay_{RUN}_pil{n}")
        ).id
        for n in range(5)
    ]
    every = [intent.id for intent in stripe.PaymentIntent.list(limit=2).auto_paging_iter()]
    assert len(every) == len(set(every)), "no intent twice"
    assert every[:5] == made[::-1], "newest first"
    assert set(every) == before | set(made), "every intent once"


def check_payment_intents_are_found_by_search_page_by_page():
    order = f"order_pi_{RUN}"
    made = [
        stripe.PaymentIntent.create(
            idempotency_key=f"{RUN}-pi-search{n}",
            **card_intent(
                f"pay_{RUN}_pis{n}",
                metadata={"payment_id": f"pay_{RUN}_pis{n}", "order": order},
            ),
        ).id
        for n in range(3)
    ]
    one = stripe.PaymentIntent.search(query=f"metadata['payment_id']:'pay_{RUN}_pis1'")
    assert one.object == "search_result" and [i.id for i in one.data] == [made[1]], one
    page = stripe.PaymentIntent.search(query=f"metadata['order']:'{order}'", limit=1)
    assert page.has_more and page.next_page, page
    assert [i.id for i in page.auto_paging_iter()] == made[::-1]


def check_a_500_after_processing_on_a_payment_intent_is_replayed():
    key = f"{RUN}-pi-after"
    params = card_intent(f"pay_{RUN}_pi9", payment_method="pm_card_visa", confirm=True)
    set_faults({"error_after_processing_rate": 1.0})
    try:
        try:
            stripe.PaymentIntent.create(idempotency_key=key, **params)
        except stripe.APIError as err:
            assert err.http_status == 500, err.http_status
        else:
            raise AssertionError("no APIError")
    finally:
        set_faults({})
    created = stats()["payment_intents_created"]
    try:
        stripe.PaymentIntent.create(idempotency_key=key, **params)
    except stripe.APIError as err:
        assert err.headers["Idempotent-Replayed"] == "true", err.headers
    else:
        raise AssertionError("the kept 500 was not replayed")
    assert stats()["payment_intents_created"] == created, "no second intent"
    found = stripe.PaymentIntent.search(query=f"metadata['payment_id']:'pay_{RUN}_pi9'")
    assert [i.status for i in found.data] == ["succeeded"], "the intent behind the 500 exists"


def check_a_payment_intent_key_reused_with_other_parameters_raises_idempotency_error():
    key = f"{RUN}-pi-mismatch"
    stripe.PaymentIntent.create(idempotency_key=key, **card_intent(f"pay_{RUN}_pi10"))
    try:
        stripe.PaymentIntent.create(
            idempotency_key=key, **card_intent(f"pay_{RUN}_pi10", amount=999)
        )
    except stripe.error.IdempotencyError as err:
        assert err.http_status == 400, err.http_status
        assert f"a key other than '{key}'" in err.user_message, err.user_message
    else:
        raise AssertionError("no IdempotencyError")


# The provider's form fields, as `cargo run -p provider --example form_fields` prints them
# (`--form-fields`), judged against the parameters the SDK documents for each endpoint.
FORM_FIELDS = None

# Each call the provider makes, by the example's name: the SDK's service method for its endpoint.
SDK_METHODS = {
    "payment_intent_create": ("PaymentIntentService", "create"),
    "payment_intent_capture": ("PaymentIntentService", "capture"),
    "payment_intent_cancel": ("PaymentIntentService", "cancel"),
    "refund_create": ("RefundService", "create"),
}

# Names the provider sends that the SDK does not document, each a known bug to fix in the
# provider (and then to remove here: the check fails if a name listed here is no longer sent, so
# the list cannot go stale). Any other undocumented name fails the check. None today: at the
# pinned API version (2026-10-28.endive) card-only is `allowed_payment_method_types`, which the
# provider sends (`payment_method_types` was removed from PaymentIntentCreateParams).
KNOWN_UNDOCUMENTED = {}


def sdk_endpoint(service_name, method_name):
    """The SDK's own endpoint for a service method: its HTTP method, its path (with `{intent}`
    where an id goes) and the names of the parameters it documents, read from the method's
    source and from its typed params (a TypedDict), without the SDK's request options
    (`idempotency_key`, `stripe_version`, ...), which are headers, not form fields."""
    method = getattr(getattr(stripe, service_name), method_name)
    found = re.search(r'self\._request\(\s*"(\w+)",\s*"([^"]+)"', inspect.getsource(method))
    assert found, f"no request in {service_name}.{method_name}"
    annotation = inspect.signature(method).parameters["params"].annotation
    if isinstance(annotation, str):
        type_name = annotation.strip("'\"")
    else:
        refs = [a for a in typing.get_args(annotation) if isinstance(a, typing.ForwardRef)]
        assert len(refs) == 1, (service_name, method_name, annotation)
        type_name = refs[0].__forward_arg__
    params_type = getattr(stripe.params, type_name)
    request_options = set(RequestOptions.__annotations__)
    documented = set(params_type.__annotations__) - request_options
    return found.group(1).upper(), found.group(2), type_name, documented


def check_the_providers_form_fields_are_parameters_the_sdk_documents():
    assert set(FORM_FIELDS) == set(SDK_METHODS), sorted(FORM_FIELDS)
    problems = []
    for call, (service_name, method_name) in SDK_METHODS.items():
        sent = FORM_FIELDS[call]
        http_method, path, type_name, documented = sdk_endpoint(service_name, method_name)
        assert (sent["method"], sent["path"]) == (http_method, path), (call, sent, path)
        assert sent["params"], f"{call}: the example printed no parameters"
        undocumented = set(sent["params"]) - documented
        known = KNOWN_UNDOCUMENTED.get(call, set())
        if undocumented - known:
            problems.append(f"{call}: {sorted(undocumented - known)} not in {type_name}")
        if known - undocumented:
            problems.append(f"{call}: {sorted(known - undocumented)} is documented or no longer "
                            "sent: remove it from KNOWN_UNDOCUMENTED")
        for name in sorted(known & undocumented):
            print(f"     KNOWN BUG: {call} sends `{name}`, which {type_name} does not document",
                  flush=True)
    assert not problems, "; ".join(problems)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary):
    """Starts the stand-in on a free port; returns the process and its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with urllib.request.urlopen(url + "/_sim/stats", timeout=1):
                return process, url
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"processor-sim exited with {process.returncode}")
            time.sleep(0.05)
    process.kill()
    raise SystemExit(f"processor-sim did not answer on {url}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--bin", help="the processor-sim binary to start on a free port")
    where.add_argument("--url", help="the base URL of a stand-in already running")
    parser.add_argument(
        "--form-fields",
        help="the JSON of `cargo run -p provider --example form_fields`: the provider's form "
        "fields, checked against the SDK's parameters (without it that check is skipped)",
    )
    args = parser.parse_args()
    global FORM_FIELDS
    if args.form_fields:
        with open(args.form_fields, encoding="utf-8") as fields:
            FORM_FIELDS = json.load(fields)

    process = None
    if args.bin:
        process, url = start(args.bin)
    else:
        url = args.url.rstrip("/")
    stripe.api_key = API_KEY
    stripe.api_base = url
    stripe.max_network_retries = 2
    stripe.enable_telemetry = False

    checks = [(name, f) for name, f in globals().items() if name.startswith("check_")]
    if FORM_FIELDS is None:
        judge = check_the_providers_form_fields_are_parameters_the_sdk_documents
        print(f"skip {judge.__name__} (no --form-fields)")
        checks = [(name, f) for name, f in checks if f is not judge]
    passed = failed = 0
    try:
        set_faults({})
        for name, check in checks:
            try:
                check()
            except Exception:  # a failed check is reported, and the others still run
                failed += 1
                print(f"FAIL {name}", flush=True)
                traceback.print_exc(file=sys.stdout)
            else:
                passed += 1
                print(f"ok   {name}", flush=True)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=10)
    print(f"stripe-python {stripe.VERSION} against {url}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
