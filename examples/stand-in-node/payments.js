// How this suite makes a payment at the stand-in: the only place that names the API
// (PaymentIntents, created and confirmed in one call), so that moving to another one is an edit of
// this file.

/** The route the creates go to, for aiming faults at them. */
export const CREATE_PATH = '/v1/payment_intents';

/**
 * A card payment of `amount` cents with the test `card`, tagged with `paymentId` in its metadata,
 * confirmed at once; `returnUrl` is where a 3-D Secure page sends the customer back.
 */
export function create(
  stripe,
  paymentId,
  { amount = 1000, idempotencyKey, apiKey, card = 'pm_card_visa', returnUrl } = {},
) {
  const params = {
    amount,
    currency: 'usd',
    payment_method: card,
    payment_method_types: ['card'],
    confirm: true,
    metadata: { payment_id: paymentId },
  };
  if (returnUrl !== undefined) params.return_url = returnUrl;
  return stripe.paymentIntents.create(params, { idempotencyKey, apiKey });
}

/** The payment the processor knows as `processorId`. */
export function retrieve(stripe, processorId, { apiKey } = {}) {
  return stripe.paymentIntents.retrieve(processorId, {}, { apiKey });
}
