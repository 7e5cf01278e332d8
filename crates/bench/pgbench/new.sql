-- The floor of `new`: the statements of one new payment, as payments-api sends them (the texts
-- are copied from crates/domain and crates/idem, in the order the engine runs them), without the
-- HTTP, the JSON and the processor call. (The API looks an API key up on its own only the first
-- time it sees it; from then on the claim checks it, as here.) The only differences are what
-- pgbench needs: plain column aliases (its \gset takes no `"id!"`), ids made from a random number
-- (it has no string variables), the fence records built in SQL (the API binds each as one
-- binary value), and literal values of the same size where the API computes them.
--
-- Variables: account, key_hash (set by payments-bench).
\set n random(1000000000, 9223372036854775806)

-- The claim with the first phase (started → payment_created), one statement that commits on its
-- own (crates/domain/src/payments/store.rs, `insert_claiming`): `idem_claim` checks the API key,
-- finds no key and stores it (the engine's `idem_fence` record, built here in SQL, with no id: the
-- function takes one from the sequence), then the payment and its audit record.
WITH claim AS (
    SELECT idem_claim(:account, :n::text, :key_hash, ROW(NULL, 'c0a80101-0000-4000-8000-000000000001', 'started', 60000, 'payment_created', '{"path": "/v1/charges", "key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge", "params": [["amount", "1000"], ["currency", "usd"], ["source", "pm_card_visa"], ["capture", "true"], ["metadata[payment_id]", "pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]}', NULL, NULL, NULL, :account, :n::text, decode('48050fa388fc8e73de7a7ad6c86da03c0cf50ba33cf761f23b79348878a1b3d0', 'hex'), 'POST', '/v1/payments', 'req_e8oJXKStH4I7DzCaPcWXJdX9', 'payments.create', '{"request": {"amount": 1000, "currency": "usd", "metadata": null, "description": null, "receipt_email": null, "capture_method": "automatic", "payment_method": "pm_card_visa"}, "account_id": "acct_7wn1R90iSiclhJyOLPAfILxt"}')::idem_fence) AS claimed
), payment AS (
    INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                          capture_method, payment_method, description, metadata,
                          receipt_email)
    SELECT 'pay_' || :n, :account, (claimed).id, 1000, 'usd', 'processing', 'automatic', 'pm_card_visa', NULL, '{}', NULL
      FROM claim WHERE (claimed).stored
    RETURNING *, xmin::text::bigint AS row_version
), audit AS (
    INSERT INTO audit_events (account_id, object_id, action, request_id,
                              idempotency_key_id, detail)
    SELECT account_id, id, 'payment.created', 'req_e8oJXKStH4I7DzCaPcWXJdX9', idempotency_key_id,
           jsonb_build_object('amount', amount, 'currency', currency)
      FROM payment
)
SELECT claim.claimed, p.idempotency_key_id AS key_id, p.id, p.account_id, p.amount, p.currency,
       p.status, p.capture_method, p.amount_captured, p.amount_refunded, p.payment_method,
       p.description, p.metadata, p.receipt_email, p.processor_charge_id, p.failure_code,
       p.failure_message, p.cancellation_reason, extract(epoch FROM p.created_at)::bigint AS created,
       p.row_version
  FROM claim LEFT JOIN payment p ON true
\gset p1_

-- (payments-api calls the processor here.)

-- Phase 2 (payment_created → finished), one statement that commits on its own
-- (crates/domain/src/payments/store.rs, `update_fenced`): the payment's update at the version
-- phase 1 wrote, its audit record, the receipt job (none here: no receipt address), the event and
-- its webhook deliveries, and the fence that stores the answer (the engine's `idem_fence`
-- record, built here in SQL).
WITH updated AS (
UPDATE payments
   SET status = coalesce('succeeded', status),
       amount_captured = coalesce(1000, amount_captured),
       amount_refunded = amount_refunded + 0,
       processor_charge_id = coalesce('ch_' || :n, processor_charge_id),
       failure_code = coalesce(NULL, failure_code),
       failure_message = coalesce(NULL, failure_message),
       cancellation_reason = coalesce(NULL, cancellation_reason),
       description = CASE WHEN false THEN NULL ELSE description END,
       metadata = coalesce(NULL, metadata),
       updated_at = now()
 WHERE id = 'pay_' || :n AND xmin::text::bigint = :p1_row_version
RETURNING account_id, id
), audit AS (
    INSERT INTO audit_events (account_id, object_id, action, request_id,
                              idempotency_key_id, detail)
    SELECT account_id, id, 'payment.charged', 'req_e8oJXKStH4I7DzCaPcWXJdX9', :p1_key_id, '{"charge": "ch_jTSo8sJMqW8JXUKh6cdKllwH", "status": "succeeded", "downstream_key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge"}'::jsonb FROM updated
), job AS (
    INSERT INTO jobs (kind, dedupe_key, payload)
    SELECT NULL, NULL, NULL FROM updated WHERE NULL::text IS NOT NULL
    ON CONFLICT (kind, dedupe_key) DO NOTHING
), event AS (
    INSERT INTO events (id, account_id, type, object)
    SELECT 'evt_' || :n, account_id, 'payment.succeeded', ('{"id": "pay_' || :n || '", "object": "payment", "amount": 1000, "currency": "usd", "status": "succeeded", "capture_method": "automatic", "amount_captured": 1000, "amount_refunded": 0, "refunded": false, "payment_method": "pm_card_visa", "description": null, "metadata": {}, "receipt_email": null, "processor_charge_id": "ch_jTSo8sJMqW8JXUKh6cdKllwH", "failure_code": null, "failure_message": null, "cancellation_reason": null, "created": 1764500000, "livemode": false}')::jsonb FROM updated
    RETURNING id, account_id, type
), deliveries AS (
    INSERT INTO jobs (kind, dedupe_key, payload)
    SELECT 'webhook', event.id || ':' || w.id,
           jsonb_build_object('event_id', event.id, 'endpoint_id', w.id)
      FROM event JOIN webhook_endpoints w ON w.account_id = event.account_id
     WHERE w.status = 'enabled' AND w.deleted_at IS NULL
       AND (event.type = ANY (w.enabled_events) OR '*' = ANY (w.enabled_events))
    ON CONFLICT (kind, dedupe_key) DO NOTHING
)
SELECT idem_commit_fence(ROW(:p1_key_id, 'c0a80101-0000-4000-8000-000000000001', 'payment_created', 60000, 'finished', NULL, 201, '[["content-type", "application/json"], ["etag", "\"963d41e78ce44c886e7cfd57\""], ["location", "/v1/payments/pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]', convert_to(repeat('x', 443), 'UTF8'), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idem_fence) AS key_id
  FROM updated;
