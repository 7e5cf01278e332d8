-- The floor of `new`: the statements of one new payment, as payments-api sends them (the texts
-- are copied from crates/domain and crates/idem, in the order the engine runs them), without the
-- HTTP, the JSON and the processor call. (The API looks an API key up on its own only the first
-- time it sees it; from then on the claim checks it, as here.) The only differences are what
-- pgbench needs: plain column aliases (its \gset takes no `"id!"`), ids made from a random number
-- (it has no string variables), and literal values of the same size where the API computes them.
--
-- Variables: account, key_hash (set by payments-bench).
\set n random(1000000000, 9223372036854775806)

-- The claim's read: one statement checks the API key and finds no key.
WITH principal AS (
    SELECT 1 AS live
     WHERE :key_hash::bytea IS NULL
        OR EXISTS (SELECT 1 FROM api_keys
                    WHERE key_hash = :key_hash AND account_id = :account AND revoked_at IS NULL)
)
SELECT k.id, k.fingerprint, k.request_method, k.request_path, k.request_id, k.operation,
       k.request_params, k.owner_token, coalesce(k.locked_until > now(), false) AS lease_active,
       k.needs_human_at IS NOT NULL AS needs_human, k.response_status, k.response_headers,
       k.response_body
  FROM principal
  LEFT JOIN idempotency_keys k ON k.account_id = :account AND k.idempotency_key = :n::text;

-- The claim's insert and phase 1 (started → payment_created) in one transaction: the key (behind
-- its gate, checking the API key again), the payment row, its audit record, the fence.
BEGIN;
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(hashtextextended(:account || '/' || :n::text, 0)) AS free
), inserted AS (
    INSERT INTO idempotency_keys
        (id, account_id, idempotency_key, fingerprint, request_method, request_path,
         request_id, operation, request_params, owner_token, locked_until)
    OVERRIDING SYSTEM VALUE
    SELECT coalesce(NULL::bigint, nextval(pg_get_serial_sequence('idempotency_keys', 'id'))),
           :account, :n, '\x48050fa388fc8e73de7a7ad6c86da03c0cf50ba33cf761f23b79348878a1b3d0'::bytea, 'POST', '/v1/payments', 'req_e8oJXKStH4I7DzCaPcWXJdX9', 'payments.create', '{"request": {"amount": 1000, "currency": "usd", "metadata": null, "description": null, "receipt_email": null, "capture_method": "automatic", "payment_method": "pm_card_visa"}, "account_id": "acct_7wn1R90iSiclhJyOLPAfILxt"}'::jsonb, 'c0a80101-0000-4000-8000-000000000001'::uuid,
           now() + 60000 * interval '1 millisecond'
      FROM gate
     WHERE gate.free
       AND (:key_hash::bytea IS NULL
            OR EXISTS (SELECT 1 FROM api_keys
                        WHERE key_hash = :key_hash AND account_id = :account AND revoked_at IS NULL))
    ON CONFLICT (account_id, idempotency_key) DO NOTHING
    RETURNING id
)
SELECT gate.free, (SELECT id FROM inserted) AS key_id FROM gate
\gset

INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                      capture_method, payment_method, description, metadata, receipt_email)
VALUES ('pay_' || :n, :account, :key_id, 1000, 'usd', 'processing', 'automatic', 'pm_card_visa', NULL, '{}', NULL)
RETURNING id, account_id, amount, currency, status, capture_method, amount_captured,
          amount_refunded, payment_method, description, metadata, receipt_email,
          processor_charge_id, failure_code, failure_message, cancellation_reason,
          extract(epoch FROM created_at)::bigint AS created;
INSERT INTO audit_events (account_id, object_id, action, request_id, idempotency_key_id, detail)
 VALUES (:account, 'pay_' || :n, 'payment.created', 'req_e8oJXKStH4I7DzCaPcWXJdX9', :key_id, '{"amount": 1000, "currency": "usd"}');
UPDATE idempotency_keys
   SET recovery_point = 'payment_created', locked_until = now() + 60000 * interval '1 millisecond',
       last_run_at = now(), planned_call = '{"key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge", "path": "/v1/charges", "fields": [["amount", "1000"], ["currency", "usd"], ["source", "pm_card_visa"], ["capture", "true"], ["metadata[payment_id]", "pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]}'::jsonb,
       unresolved_at = NULL
 WHERE id = :key_id AND owner_token = 'c0a80101-0000-4000-8000-000000000001' AND recovery_point = 'started';
COMMIT;

-- (payments-api calls the processor here.)

-- Phase 2 (payment_created → finished): the processor's answer and the stored response.
BEGIN;
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
 WHERE id = 'pay_' || :n
RETURNING id, account_id, amount, currency, status, capture_method, amount_captured,
          amount_refunded, payment_method, description, metadata, receipt_email,
          processor_charge_id, failure_code, failure_message, cancellation_reason,
          extract(epoch FROM created_at)::bigint AS created;
INSERT INTO audit_events (account_id, object_id, action, request_id, idempotency_key_id, detail)
 VALUES (:account, 'pay_' || :n, 'payment.charged', 'req_e8oJXKStH4I7DzCaPcWXJdX9', :key_id, '{"charge": "ch_jTSo8sJMqW8JXUKh6cdKllwH", "status": "succeeded", "downstream_key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge"}');
UPDATE idempotency_keys
   SET recovery_point = 'finished', owner_token = NULL, locked_until = NULL,
       response_status = 201, response_headers = '[["content-type", "application/json"], ["etag", "\"963d41e78ce44c886e7cfd57\""], ["location", "/v1/payments/pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]', response_body = convert_to(repeat('x', 443), 'UTF8'),
       completed_at = now(), last_run_at = now(), last_error = NULL
 WHERE id = :key_id AND owner_token = 'c0a80101-0000-4000-8000-000000000001' AND recovery_point = 'payment_created';
COMMIT;
