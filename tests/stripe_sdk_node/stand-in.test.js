// Stripe's official Node SDK (stripe-node, pinned in package.json) as a judge of the stand-in
// processor's PaymentIntents: every flow is called the way an application calls Stripe, through
// `stripe.paymentIntents` and `stripe.refunds` with their paging helpers and the SDK's own
// retries on; a 3-D Secure authentication is completed or failed through the stand-in's control
// route, as a customer would on Stripe's test page. The checks mirror the PaymentIntent checks of
// tests/stripe_sdk/test_stand_in.py, so that the Python and the Node SDK judge the same flows.
//
//     node --test                         # PROCESSOR_SIM, or ../../target/debug/processor-sim
//     node stand-in.test.js path/to/processor-sim
//
// It starts the stand-in on a free port. scripts/stripe-sdk.sh (`make stripe-sdk`) installs the
// pinned SDK under target/ (`npm ci`) and runs this after the Python suite.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { accessSync, constants } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { createServer } from 'node:net';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import Stripe from 'stripe';

const API_KEY = 'sk_test_stripe_sdk_node';
// A prefix no earlier run used, as the Python suite tags its objects.
const RUN = randomUUID().replaceAll('-', '').slice(0, 12);
const here = fileURLToPath(new URL('.', import.meta.url));

/** The binary: the first argument, $PROCESSOR_SIM, or the workspace's debug build. */
function binary() {
  const argument = process.argv[2];
  if (argument && !argument.startsWith('-')) return argument;
  return process.env.PROCESSOR_SIM ?? `${here}../../target/debug/processor-sim`;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

let child;
let url;
let stripe;

before(async () => {
  const path = binary();
  accessSync(path, constants.X_OK); // a clear error if it is not built
  const port = await freePort();
  child = spawn(path, ['--port', String(port)], { stdio: 'ignore' });
  url = `http://127.0.0.1:${port}`;
  const giveUp = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`processor-sim exited with ${child.exitCode}`);
    try {
      const response = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(1000) });
      if (response.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > giveUp) throw new Error(`processor-sim did not answer on ${url}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  stripe = new Stripe(API_KEY, {
    host: '127.0.0.1',
    port,
    protocol: 'http',
    maxNetworkRetries: 2,
    telemetry: false,
  });
});

after(async () => {
  if (!child || child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  await exited;
});

/** A call to the stand-in's own control surface (`/_sim/...`), outside the SDK. */
async function sim(method, path, body) {
  const response = await fetch(`${url}${path}`, {
    method,
    headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${JSON.stringify(answer)}`);
  return answer;
}

const stats = () => sim('GET', '/_sim/stats');

/** Completes or fails a pending 3-D Secure authentication, as Stripe's test page does. */
const authenticate = (id, outcome) =>
  sim('POST', `/_sim/payment_intents/${id}/authenticate`, { outcome });

/** Parameters of a 1000-cent card-only PaymentIntent, tagged with `paymentId`. */
function cardIntent(paymentId, extra = {}) {
  return {
    amount: 1000,
    currency: 'usd',
    payment_method_types: ['card'],
    metadata: { payment_id: paymentId, run: RUN },
    ...extra,
  };
}

/** `promise` rejects with an error of `type`; `check` looks at it further. */
async function rejectsWith(promise, type, check = () => {}) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof type, `${err.type}: ${err.message}`);
    check(err);
    return true;
  });
}

test('a payment intent is created, then confirmed with a charge under it', async () => {
  const paymentId = `pay_${RUN}_pi1`;
  const intent = await stripe.paymentIntents.create(
    cardIntent(paymentId, { payment_method: 'pm_card_visa' }),
    { idempotencyKey: `${RUN}-pi-create` },
  );
  assert.equal(intent.object, 'payment_intent');
  assert.match(intent.id, /^pi_/);
  assert.equal(intent.status, 'requires_confirmation');
  assert.equal(intent.latest_charge, null);
  assert.ok(intent.client_secret.startsWith(`${intent.id}_secret_`), intent.client_secret);
  const confirmed = await stripe.paymentIntents.confirm(
    intent.id,
    {},
    { idempotencyKey: `${RUN}-pi-confirm` },
  );
  assert.equal(confirmed.status, 'succeeded');
  assert.equal(confirmed.amount_received, 1000);
  const charge = await stripe.charges.retrieve(confirmed.latest_charge);
  assert.equal(charge.payment_intent, intent.id);
  assert.equal(charge.captured, true);
  assert.equal(charge.metadata.payment_id, paymentId);
  assert.equal((await stripe.paymentIntents.retrieve(intent.id)).status, 'succeeded');
  const oneCall = await stripe.paymentIntents.create(
    cardIntent(`pay_${RUN}_pi1b`, { payment_method: 'pm_card_mastercard', confirm: true }),
    { idempotencyKey: `${RUN}-pi-one-call` },
  );
  assert.equal(oneCall.status, 'succeeded');
});

test('a declined confirmation raises StripeCardError with the intent inside', async () => {
  let intent;
  const params = cardIntent(`pay_${RUN}_pi2`, {
    payment_method: 'pm_card_chargeDeclinedInsufficientFunds',
    confirm: true,
  });
  await rejectsWith(
    stripe.paymentIntents.create(params, { idempotencyKey: `${RUN}-pi-decline` }),
    Stripe.errors.StripeCardError,
    (err) => {
      assert.equal(err.statusCode, 402);
      assert.equal(err.code, 'card_declined');
      assert.equal(err.decline_code, 'insufficient_funds');
      intent = err.raw.payment_intent;
      assert.equal(intent.status, 'requires_payment_method');
      assert.equal(intent.last_payment_error.code, 'card_declined');
      assert.equal(intent.latest_charge, err.raw.charge);
    },
  );
  assert.equal((await stripe.charges.retrieve(intent.latest_charge)).status, 'failed');
  const again = await stripe.paymentIntents.confirm(
    intent.id,
    { payment_method: 'pm_card_visa' },
    { idempotencyKey: `${RUN}-pi-decline-retry` },
  );
  assert.equal(again.status, 'succeeded');
  assert.equal(again.last_payment_error, null);
});

test('an authentication completed at the stand-in makes the payment succeed', async () => {
  const params = cardIntent(`pay_${RUN}_pi3`, {
    payment_method: 'pm_card_authenticationRequired',
    confirm: true,
    return_url: 'https://shop.example/back',
  });
  const key = `${RUN}-pi-3ds`;
  const intent = await stripe.paymentIntents.create(params, { idempotencyKey: key });
  assert.equal(intent.status, 'requires_action');
  assert.equal(intent.next_action.type, 'redirect_to_url');
  assert.ok(intent.next_action.redirect_to_url.url.endsWith(`/_sim/authenticate/${intent.id}`));
  assert.equal(intent.next_action.redirect_to_url.return_url, 'https://shop.example/back');
  assert.equal(intent.latest_charge, null);
  assert.equal((await authenticate(intent.id, 'complete')).status, 'succeeded');
  const done = await stripe.paymentIntents.retrieve(intent.id);
  assert.equal(done.status, 'succeeded');
  assert.match(done.latest_charge, /^ch_/);
  const replayed = await stripe.paymentIntents.create(params, { idempotencyKey: key });
  assert.equal(replayed.status, 'requires_action', 'the key keeps the answer it gave');
  assert.equal(replayed.lastResponse.headers['idempotent-replayed'], 'true');
});

test('an authentication failed at the stand-in asks for another payment method', async () => {
  const intent = await stripe.paymentIntents.create(
    cardIntent(`pay_${RUN}_pi4`, { payment_method: 'pm_card_threeDSecure2Required', confirm: true }),
    { idempotencyKey: `${RUN}-pi-3ds-fail` },
  );
  assert.equal(intent.status, 'requires_action');
  assert.equal(intent.next_action.type, 'use_stripe_sdk');
  await authenticate(intent.id, 'fail');
  const failed = await stripe.paymentIntents.retrieve(intent.id);
  assert.equal(failed.status, 'requires_payment_method');
  assert.equal(failed.latest_charge, null);
  assert.equal(failed.last_payment_error.code, 'payment_intent_authentication_failure');
});

test('a manual capture takes the whole authorization', async () => {
  const intent = await stripe.paymentIntents.create(
    cardIntent(`pay_${RUN}_pi5`, {
      payment_method: 'pm_card_visa',
      confirm: true,
      capture_method: 'manual',
    }),
    { idempotencyKey: `${RUN}-pi-manual` },
  );
  assert.equal(intent.status, 'requires_capture');
  assert.equal(intent.amount_capturable, 1000);
  const captured = await stripe.paymentIntents.capture(
    intent.id,
    {},
    { idempotencyKey: `${RUN}-pi-capture` },
  );
  assert.equal(captured.status, 'succeeded');
  assert.equal(captured.amount_received, 1000);
  await rejectsWith(
    stripe.paymentIntents.capture(intent.id, {}, { idempotencyKey: `${RUN}-pi-capture-again` }),
    Stripe.errors.StripeInvalidRequestError,
    (err) => assert.equal(err.code, 'payment_intent_unexpected_state'),
  );
});

test('a partial capture releases the rest', async () => {
  const intent = await stripe.paymentIntents.create(
    cardIntent(`pay_${RUN}_pi6`, {
      payment_method: 'pm_card_visa',
      confirm: true,
      capture_method: 'manual',
    }),
    { idempotencyKey: `${RUN}-pi-partial` },
  );
  const captured = await stripe.paymentIntents.capture(
    intent.id,
    { amount_to_capture: 600 },
    { idempotencyKey: `${RUN}-pi-partial-capture` },
  );
  assert.equal(captured.status, 'succeeded');
  assert.equal(captured.amount_received, 600);
  const charge = await stripe.charges.retrieve(captured.latest_charge);
  assert.deepEqual([charge.amount_captured, charge.amount_refunded], [600, 400]);
});

test('an intent is canceled and its authorization released', async () => {
  const intent = await stripe.paymentIntents.create(
    cardIntent(`pay_${RUN}_pi7`, {
      payment_method: 'pm_card_visa',
      confirm: true,
      capture_method: 'manual',
    }),
    { idempotencyKey: `${RUN}-pi-cancel` },
  );
  const canceled = await stripe.paymentIntents.cancel(
    intent.id,
    { cancellation_reason: 'requested_by_customer' },
    { idempotencyKey: `${RUN}-pi-cancel-1` },
  );
  assert.equal(canceled.status, 'canceled');
  assert.equal(canceled.cancellation_reason, 'requested_by_customer');
  assert.equal((await stripe.charges.retrieve(intent.latest_charge)).refunded, true);
  await rejectsWith(
    stripe.paymentIntents.cancel(intent.id, {}, { idempotencyKey: `${RUN}-pi-cancel-2` }),
    Stripe.errors.StripeInvalidRequestError,
    (err) => {
      assert.equal(err.code, 'payment_intent_unexpected_state');
      assert.equal(err.raw.payment_intent.status, 'canceled');
    },
  );
});

test('a refund by payment_intent refunds its charge and is listed by it', async () => {
  const intent = await stripe.paymentIntents.create(
    cardIntent(`pay_${RUN}_pi8`, { payment_method: 'pm_card_visa', confirm: true }),
    { idempotencyKey: `${RUN}-pi-refund` },
  );
  const made = [];
  for (let n = 0; n < 3; n += 1) {
    const refund = await stripe.refunds.create(
      { payment_intent: intent.id, amount: 100 },
      { idempotencyKey: `${RUN}-pi-refund${n}` },
    );
    made.push(refund.id);
  }
  const listed = await stripe.refunds.list({ payment_intent: intent.id, limit: 2 });
  assert.equal(listed.has_more, true);
  for (const refund of listed.data) {
    assert.deepEqual(
      [refund.payment_intent, refund.charge],
      [intent.id, intent.latest_charge],
    );
  }
  const every = [];
  for await (const refund of stripe.refunds.list({ payment_intent: intent.id, limit: 2 })) {
    every.push(refund.id);
  }
  assert.deepEqual(every, made.toReversed());
  assert.equal((await stripe.charges.retrieve(intent.latest_charge)).amount_refunded, 300);
});

test('payment intents are listed page by page with auto-paging', async () => {
  const before = new Set(
    (await stripe.paymentIntents.list({ limit: 100 }).autoPagingToArray({ limit: 10_000 })).map(
      (intent) => intent.id,
    ),
  );
  const made = [];
  for (let n = 0; n < 5; n += 1) {
    const intent = await stripe.paymentIntents.create(cardIntent(`pay_${RUN}_pil${n}`), {
      idempotencyKey: `${RUN}-pi-list${n}`,
    });
    made.push(intent.id);
  }
  const firstPage = await stripe.paymentIntents.list({ limit: 2 });
  assert.equal(firstPage.data.length, 2);
  assert.equal(firstPage.has_more, true);
  const every = [];
  for await (const intent of stripe.paymentIntents.list({ limit: 2 })) every.push(intent.id);
  assert.equal(new Set(every).size, every.length, 'no intent twice');
  assert.deepEqual(every.slice(0, 5), made.toReversed(), 'newest first');
  assert.deepEqual(new Set(every), new Set([...before, ...made]), 'every intent once');
  const asArray = await stripe.paymentIntents.list({ limit: 2 }).autoPagingToArray({ limit: 1000 });
  assert.deepEqual(
    asArray.map((intent) => intent.id),
    every,
  );
});

test('payment intents are found by search page by page', async () => {
  const order = `order_pi_${RUN}`;
  const made = [];
  for (let n = 0; n < 3; n += 1) {
    const paymentId = `pay_${RUN}_pis${n}`;
    const intent = await stripe.paymentIntents.create(
      cardIntent(paymentId, { metadata: { payment_id: paymentId, order } }),
      { idempotencyKey: `${RUN}-pi-search${n}` },
    );
    made.push(intent.id);
  }
  const one = await stripe.paymentIntents.search({
    query: `metadata['payment_id']:'pay_${RUN}_pis1'`,
  });
  assert.equal(one.object, 'search_result');
  assert.deepEqual(
    one.data.map((intent) => intent.id),
    [made[1]],
  );
  const page = await stripe.paymentIntents.search({ query: `metadata['order']:'${order}'`, limit: 1 });
  assert.equal(page.has_more, true);
  assert.ok(page.next_page, 'a next page token');
  const every = await stripe.paymentIntents
    .search({ query: `metadata['order']:'${order}'`, limit: 1 })
    .autoPagingToArray({ limit: 100 });
  assert.deepEqual(
    every.map((intent) => intent.id),
    made.toReversed(),
  );
});

test('a 500 after processing is kept: the retry with the same key gets the same 500', async () => {
  const key = `${RUN}-pi-after`;
  const paymentId = `pay_${RUN}_pi9`;
  const params = cardIntent(paymentId, { payment_method: 'pm_card_visa', confirm: true });
  await sim('POST', '/_sim/faults/aimed', {
    fault: 'error_after_processing',
    method: 'POST',
    path: '/v1/payment_intents',
    match: { idempotency_key: key },
  });
  const requestsBefore = (await stats()).requests;
  await rejectsWith(
    stripe.paymentIntents.create(params, { idempotencyKey: key }),
    Stripe.errors.StripeAPIError,
    (err) => assert.equal(err.statusCode, 500),
  );
  // Stripe-Should-Retry: false, as Stripe sends with a 500 it will replay: the SDK sent it once.
  assert.equal((await stats()).requests, requestsBefore + 1);
  const created = (await stats()).payment_intents_created;
  await rejectsWith(
    stripe.paymentIntents.create(params, { idempotencyKey: key }),
    Stripe.errors.StripeAPIError,
    (err) => {
      assert.equal(err.statusCode, 500);
      assert.equal(err.headers['idempotent-replayed'], 'true');
    },
  );
  assert.equal((await stats()).payment_intents_created, created, 'no second intent');
  const found = await stripe.paymentIntents.search({
    query: `metadata['payment_id']:'${paymentId}'`,
  });
  assert.deepEqual(
    found.data.map((intent) => intent.status),
    ['succeeded'],
    'the intent behind the 500 exists',
  );
});

test('a key reused with other parameters raises StripeIdempotencyError', async () => {
  const key = `${RUN}-pi-mismatch`;
  await stripe.paymentIntents.create(cardIntent(`pay_${RUN}_pi10`), { idempotencyKey: key });
  await rejectsWith(
    stripe.paymentIntents.create(cardIntent(`pay_${RUN}_pi10`, { amount: 999 }), {
      idempotencyKey: key,
    }),
    Stripe.errors.StripeIdempotencyError,
    (err) => {
      assert.equal(err.statusCode, 400);
      assert.ok(err.message.includes(`a key other than '${key}'`), err.message);
    },
  );
});

test('webhooks verify with constructEvent and carry the intent and its key', async () => {
  const secret = `whsec_${RUN}`;
  const received = [];
  const server = createHttpServer((request, response) => {
    const chunks = [];
    request.on('data', (chunk) => chunks.push(chunk));
    request.on('end', () => {
      received.push({ payload: Buffer.concat(chunks), signature: request.headers['stripe-signature'] });
      response.end('ok');
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const hook = `http://127.0.0.1:${server.address().port}/hook`;
  await sim('PUT', '/_sim/webhooks', { url: hook, secret });
  try {
    const key = `${RUN}-pi-webhook`;
    const intent = await stripe.paymentIntents.create(
      cardIntent(`pay_${RUN}_pi11`, { payment_method: 'pm_card_visa', confirm: true }),
      { idempotencyKey: key },
    );
    const giveUp = Date.now() + 10_000;
    const events = () =>
      received.map(({ payload, signature }) =>
        stripe.webhooks.constructEvent(payload, signature, secret),
      );
    while (!events().some((event) => event.type === 'payment_intent.succeeded')) {
      assert.ok(Date.now() < giveUp, 'payment_intent.succeeded never came');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const event = events().find((one) => one.type === 'payment_intent.succeeded');
    assert.equal(event.data.object.id, intent.id);
    assert.equal(event.request.idempotency_key, key);
    const { payload, signature } = received[0];
    assert.throws(
      () => stripe.webhooks.constructEvent(payload, signature, 'whsec_not_the_secret'),
      Stripe.errors.StripeSignatureVerificationError,
    );
  } finally {
    await sim('PUT', '/_sim/webhooks', null);
    await new Promise((resolve) => server.close(resolve));
  }
});
