"""How this suite makes a payment at the stand-in: the only place that names the API
(PaymentIntents, created and confirmed in one call), so that moving to another one is an edit of
this file."""

import stripe

# The route the creates go to, for aiming faults at them.
CREATE_PATH = "/v1/payment_intents"


def create(
    payment_id, amount=1000, idempotency_key=None, api_key=None, card="pm_card_visa", return_url=None
):
    """A card payment of `amount` cents with the test `card`, tagged with `payment_id` in its
    metadata, confirmed at once; `return_url` is where a 3-D Secure page sends the customer back."""
    extra = {} if return_url is None else {"return_url": return_url}
    return stripe.PaymentIntent.create(
        amount=amount,
        currency="usd",
        payment_method=card,
        payment_method_types=["card"],
        confirm=True,
        metadata={"payment_id": payment_id},
        idempotency_key=idempotency_key,
        api_key=api_key,
        **extra,
    )


def retrieve(processor_id, api_key=None):
    """The payment the processor knows as `processor_id`."""
    return stripe.PaymentIntent.retrieve(processor_id, api_key=api_key)
