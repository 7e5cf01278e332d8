"""How this suite makes a payment at the stand-in: the only place that names the API, so that
moving from Charges to PaymentIntents is an edit of this file."""

import stripe

# The route the creates go to, for aiming faults at them.
CREATE_PATH = "/v1/charges"


def create(payment_id, amount=1000, idempotency_key=None, api_key=None):
    """A card payment of `amount` cents, tagged with `payment_id` in its metadata."""
    return stripe.Charge.create(
        amount=amount,
        currency="usd",
        source="pm_card_visa",
        metadata={"payment_id": payment_id},
        idempotency_key=idempotency_key,
        api_key=api_key,
    )


def retrieve(processor_id, api_key=None):
    """The payment the processor knows as `processor_id`."""
    return stripe.Charge.retrieve(processor_id, api_key=api_key)
