// How this suite makes a payment at the stand-in: the only place that names the API, so that
// moving from Charges to PaymentIntents is an edit of this file.

/** The route the creates go to, for aiming faults at them. */
export const CREATE_PATH = '/v1/charges';

/** A card payment of `amount` cents, tagged with `paymentId` in its metadata. */
export function create(stripe, paymentId, { amount = 1000, idempotencyKey, apiKey } = {}) {
  return stripe.charges.create(
    { amount, currency: 'usd', source: 'pm_card_visa', metadata: { payment_id: paymentId } },
    { idempotencyKey, apiKey },
  );
}

/** The payment the processor knows as `processorId`. */
export function retrieve(stripe, processorId, { apiKey } = {}) {
  return stripe.charges.retrieve(processorId, {}, { apiKey });
}
