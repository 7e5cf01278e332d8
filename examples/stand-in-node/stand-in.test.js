// The stand-in as node's test runner drives it, asserting with Stripe's own Node SDK.
import assert from 'node:assert/strict';
import { after, before, beforeEach, test } from 'node:test';
import Stripe from 'stripe';

import * as payments from './payments.js';
import { StandIn } from './standIn.js';

// This suite's account at the stand-in: a reset of this key forgets only what it made.
const API_KEY = 'sk_test_example_node';
const OTHER_KEY = 'sk_test_another_suite';

let sim;
let stripe;

before(async () => {
  sim = await StandIn.start();
  stripe = new Stripe(API_KEY, {
    host: '127.0.0.1',
    port: sim.port,
    protocol: 'http',
    // The SDK retries a broken connection with the same Idempotency-Key.
    maxNetworkRetries: 2,
    telemetry: false,
  });
});

after(async () => {
  await sim?.stop();
});

// Each test starts from an empty stand-in.
beforeEach(async () => {
  await sim.reset();
});

test('a payment replayed under its idempotency key is the same payment', async () => {
  const first = await payments.create(stripe, 'pay_1', { idempotencyKey: 'key-1' });
  const again = await payments.create(stripe, 'pay_1', { idempotencyKey: 'key-1' });
  assert.equal(again.id, first.id);
  assert.equal(again.lastResponse.headers['idempotent-replayed'], 'true');
});

test('a lost answer is retried by the SDK and the retry gets the payment', async () => {
  await sim.aim('lose_answer', {
    method: 'POST',
    path: payments.CREATE_PATH,
    match: { idempotency_key: 'key-lost' },
  });
  const payment = await payments.create(stripe, 'pay_2', { idempotencyKey: 'key-lost' });
  // The first attempt made the payment and lost its answer; the SDK's retry, with the same key,
  // was answered from the key.
  assert.equal(payment.lastResponse.headers['idempotent-replayed'], 'true');
  assert.equal(payment.metadata.payment_id, 'pay_2');
  assert.equal((await sim.stats()).payment_intents_created, 1);
  assert.deepEqual(await sim.aimed(), [], 'the rule fired once and is spent');
});

test('a 500 after processing is kept and the retry gets the same 500', async () => {
  await sim.aim('error_after_processing', {
    path: payments.CREATE_PATH,
    match: { metadata: { payment_id: 'pay_3' } },
  });
  await assert.rejects(payments.create(stripe, 'pay_3', { idempotencyKey: 'key-500' }), (err) => {
    assert.ok(err instanceof Stripe.errors.StripeAPIError, err.type);
    assert.equal(err.statusCode, 500);
    return true;
  });
  await assert.rejects(payments.create(stripe, 'pay_3', { idempotencyKey: 'key-500' }), (err) => {
    assert.equal(err.statusCode, 500);
    assert.equal(err.headers['idempotent-replayed'], 'true');
    return true;
  });
  assert.equal(
    (await sim.stats()).payment_intents_created,
    1,
    'the payment behind the 500 was made once',
  );
});

test('a key reused after its expiry executes again', async () => {
  const first = await payments.create(stripe, 'pay_4', { idempotencyKey: 'key-expiring' });
  await sim.advanceClock(24 * 60 * 60 + 1); // Stripe keeps a key for 24 hours
  const again = await payments.create(stripe, 'pay_4', { idempotencyKey: 'key-expiring' });
  assert.notEqual(again.id, first.id);
  assert.ok(again.created >= first.created + 24 * 60 * 60, `${again.created} ${first.created}`);
});

test('a reset forgets the payments of its key only', async () => {
  const mine = await payments.create(stripe, 'pay_5');
  const theirs = await payments.create(stripe, 'pay_5', { apiKey: OTHER_KEY });
  const { removed } = await sim.reset(API_KEY);
  assert.deepEqual([removed.payment_intents, removed.charges], [1, 1]);
  await assert.rejects(payments.retrieve(stripe, mine.id), (err) => {
    assert.ok(err instanceof Stripe.errors.StripeInvalidRequestError, err.type);
    assert.equal(err.statusCode, 404);
    return true;
  });
  assert.equal((await payments.retrieve(stripe, theirs.id, { apiKey: OTHER_KEY })).id, theirs.id);
  assert.equal((await sim.reset()).removed.payment_intents, 1);
});

test('a 3-D Secure payment waits for the customer, then succeeds', async () => {
  const waiting = await payments.create(stripe, 'pay_6', {
    idempotencyKey: 'key-3ds',
    card: 'pm_card_threeDSecure2Required',
    returnUrl: 'https://shop.example/back',
  });
  assert.equal(waiting.status, 'requires_action');
  assert.equal(waiting.next_action.type, 'redirect_to_url');
  assert.ok(waiting.next_action.redirect_to_url.url.endsWith(`/_sim/authenticate/${waiting.id}`));
  assert.equal(waiting.latest_charge, null);
  // The customer completes the authentication on the stand-in's test page.
  assert.equal((await sim.authenticate(waiting.id, 'complete')).status, 'succeeded');
  const done = await payments.retrieve(stripe, waiting.id);
  assert.equal(done.status, 'succeeded');
  assert.equal(done.amount_received, 1000);
  assert.match(done.latest_charge, /^ch_/);
});
