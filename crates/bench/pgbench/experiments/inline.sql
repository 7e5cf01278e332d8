-- Experiment (session 16): new.sql with the claim and the fence written into the statements as
-- plain SQL instead of the plpgsql functions `idem_claim` and `idem_commit_fence` (a lost lease
-- calls `idem_lost`, a plpgsql function that only raises IL001 and that this experiment creates:
-- `CREATE FUNCTION idem_lost(key_id bigint) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE
-- EXCEPTION 'the lease on idempotency key % was lost', key_id USING ERRCODE = 'IL001'; END $$;`).
-- The same writes, the same order. See BENCHMARKS.md, "Session 16".
--
-- Variables: account, key_hash (as for new.sql).
\set n random(1000000000, 9223372036854775806)
WITH live AS (
    SELECT 1 FROM api_keys a
     WHERE a.key_hash = :key_hash AND a.account_id = :account AND a.revoked_at IS NULL
), found AS (
    SELECT k.id, k.fingerprint, k.request_method, k.request_path, k.request_id, k.operation,
           CASE WHEN k.response_status IS NULL THEN k.request_params END AS request_params,
           k.owner_token, coalesce(k.locked_until > now(), false) AS lease_active,
           k.needs_human_at IS NOT NULL AS needs_human, k.response_status, k.response_headers,
           k.response_body, (extract(epoch FROM k.completed_at) * 1000000)::int8 AS completed_at_us
      FROM idempotency_keys k
     WHERE k.account_id = :account AND k.idempotency_key = :n::text AND EXISTS (SELECT FROM live)
), key AS (
    INSERT INTO idempotency_keys
        (account_id, idempotency_key, fingerprint, request_method, request_path,
         request_id, operation, request_params, recovery_point, planned_call, owner_token,
         locked_until)
    SELECT :account, :n::text, decode('48050fa388fc8e73de7a7ad6c86da03c0cf50ba33cf761f23b79348878a1b3d0', 'hex'), 'POST', '/v1/payments', 'req_e8oJXKStH4I7DzCaPcWXJdX9', 'payments.create', '{"request": {"amount": 1000, "currency": "usd", "metadata": null, "description": null, "receipt_email": null, "capture_method": "automatic", "payment_method": "pm_card_visa"}, "account_id": "acct_7wn1R90iSiclhJyOLPAfILxt"}', 'payment_created', '{"path": "/v1/charges", "key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge", "params": [["amount", "1000"], ["currency", "usd"], ["source", "pm_card_visa"], ["capture", "true"], ["metadata[payment_id]", "pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]}', 'c0a80101-0000-4000-8000-000000000001', now() + 60000 * interval '1 millisecond'
     WHERE EXISTS (SELECT FROM live) AND NOT EXISTS (SELECT FROM found)
    RETURNING id
), payment AS (
    INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                          capture_method, payment_method, description, metadata,
                          receipt_email)
    SELECT 'pay_' || :n, :account, key.id, 1000, 'usd', 'processing', 'automatic', 'pm_card_visa', NULL, '{}', NULL
      FROM key
    RETURNING *, xmin::text::bigint AS row_version
), audit AS (
    INSERT INTO audit_events (account_id, object_id, action, request_id,
                              idempotency_key_id, detail)
    SELECT account_id, id, 'payment.created', 'req_e8oJXKStH4I7DzCaPcWXJdX9', idempotency_key_id,
           jsonb_build_object('amount', amount, 'currency', currency)
      FROM payment
)
SELECT v.version, (extract(epoch FROM now()) * 1000000)::int8 AS now_us,
       EXISTS (SELECT FROM live) AS live, found.*, p.idempotency_key_id AS key_id, p.id, p.account_id, p.amount, p.currency,
       p.status, p.capture_method, p.amount_captured, p.amount_refunded, p.payment_method,
       p.description, p.metadata, p.receipt_email, p.processor_charge_id, p.failure_code,
       p.failure_message, p.cancellation_reason, extract(epoch FROM p.created_at)::bigint AS created,
       p.row_version
  FROM credentials_version v LEFT JOIN found ON true LEFT JOIN payment p ON true
\gset p1_
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
), fence AS (
    UPDATE idempotency_keys
       SET recovery_point = 'finished', owner_token = NULL, locked_until = NULL,
           response_status = 201, response_headers = '[["content-type", "application/json"], ["etag", "\"963d41e78ce44c886e7cfd57\""], ["location", "/v1/payments/pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]', response_body = convert_to(repeat('x', 443), 'UTF8'),
           completed_at = now(), last_run_at = now(), last_error = NULL
     WHERE id = :p1_key_id AND owner_token = 'c0a80101-0000-4000-8000-000000000001' AND recovery_point = 'payment_created'
       AND EXISTS (SELECT FROM updated)
    RETURNING id
)
SELECT CASE WHEN fence.id IS NULL THEN idem_lost(:p1_key_id) ELSE fence.id END AS key_id
  FROM updated LEFT JOIN fence ON true;
