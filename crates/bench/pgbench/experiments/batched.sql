-- Experiment (session 16), not a floor `make bench` runs: new.sql's two statements written set-based,
-- so that one statement makes BATCH payments' phase (BATCH is replaced by a number before a run:
-- `sed s/BATCH/8/`; a literal, not a pgbench variable, so that Postgres settles on a generic plan
-- after five executions as it does for new.sql). The writes per payment are new.sql's: the key
-- (claimed only where it is absent and the API key is live), the payment and its audit record; then
-- the payment's update at the version the first statement wrote, its audit record, the event and
-- its webhook deliveries, and the key's fence. Two things differ from what an implementation would
-- send: the fence is an inline fenced UPDATE (the API calls idem_commit_fence, which raises IL001
-- for a lost lease; here a lost lease would only leave its payment's row out of the fence's
-- RETURNING), and the receipt job's no-op CTE is left out (new.sql sends it with no receipt). The
-- ids are :n * 10 + 1 … :n * 10 + BATCH. See BENCHMARKS.md, "Session 16".
--
-- Variables: account, key_hash (as for new.sql).
\set n random(100000000, 922337203685477580)
WITH live AS (
    SELECT 1 FROM api_keys a
     WHERE a.key_hash = :key_hash AND a.account_id = :account AND a.revoked_at IS NULL
), input AS (
    SELECT g, (:n::bigint * 10 + g)::text AS k FROM generate_series(1, BATCH) g
), found AS (
    SELECT k.id, k.idempotency_key, k.fingerprint, k.request_method, k.request_path, k.request_id, k.operation,
           CASE WHEN k.response_status IS NULL THEN k.request_params END AS request_params,
           k.owner_token, coalesce(k.locked_until > now(), false) AS lease_active,
           k.needs_human_at IS NOT NULL AS needs_human, k.response_status, k.response_headers,
           k.response_body, (extract(epoch FROM k.completed_at) * 1000000)::int8 AS completed_at_us
      FROM idempotency_keys k JOIN input ON k.idempotency_key = input.k
     WHERE k.account_id = :account AND EXISTS (SELECT FROM live)
), key AS (
    INSERT INTO idempotency_keys
        (account_id, idempotency_key, fingerprint, request_method, request_path,
         request_id, operation, request_params, recovery_point, planned_call, owner_token,
         locked_until)
    SELECT :account, input.k, decode('48050fa388fc8e73de7a7ad6c86da03c0cf50ba33cf761f23b79348878a1b3d0', 'hex'), 'POST', '/v1/payments', 'req_e8oJXKStH4I7DzCaPcWXJdX9', 'payments.create', '{"request": {"amount": 1000, "currency": "usd", "metadata": null, "description": null, "receipt_email": null, "capture_method": "automatic", "payment_method": "pm_card_visa"}, "account_id": "acct_7wn1R90iSiclhJyOLPAfILxt"}', 'payment_created', '{"path": "/v1/charges", "key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge", "params": [["amount", "1000"], ["currency", "usd"], ["source", "pm_card_visa"], ["capture", "true"], ["metadata[payment_id]", "pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]}', 'c0a80101-0000-4000-8000-000000000001', now() + 60000 * interval '1 millisecond'
      FROM input
     WHERE EXISTS (SELECT FROM live) AND NOT EXISTS (SELECT FROM found WHERE found.idempotency_key = input.k)
    RETURNING id, idempotency_key
), payment AS (
    INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                          capture_method, payment_method, description, metadata,
                          receipt_email)
    SELECT 'pay_' || key.idempotency_key, :account, key.id, 1000, 'usd', 'processing', 'automatic', 'pm_card_visa', NULL, '{}', NULL
      FROM key
    RETURNING *, xmin::text::bigint AS row_version
), audit AS (
    INSERT INTO audit_events (account_id, object_id, action, request_id,
                              idempotency_key_id, detail)
    SELECT account_id, id, 'payment.created', 'req_e8oJXKStH4I7DzCaPcWXJdX9', idempotency_key_id,
           jsonb_build_object('amount', amount, 'currency', currency)
      FROM payment
)
SELECT array_agg(p.idempotency_key_id) AS kids, array_agg(p.id) AS pids, array_agg(p.row_version) AS versions,
       min(v.version::text) AS version, count(found.id) AS found
  FROM credentials_version v LEFT JOIN found ON true LEFT JOIN payment p ON true
\gset p1_

WITH input AS (
    SELECT * FROM unnest(:p1_kids::bigint[], :p1_pids::text[], :p1_versions::bigint[]) AS t(key_id, pid, version)
), updated AS (
UPDATE payments
   SET status = coalesce('succeeded', status),
       amount_captured = coalesce(1000, amount_captured),
       amount_refunded = amount_refunded + 0,
       processor_charge_id = coalesce('ch_' || input.pid, processor_charge_id),
       failure_code = coalesce(NULL, failure_code),
       failure_message = coalesce(NULL, failure_message),
       cancellation_reason = coalesce(NULL, cancellation_reason),
       description = CASE WHEN false THEN NULL ELSE description END,
       metadata = coalesce(NULL, metadata),
       updated_at = now()
  FROM input
 WHERE payments.id = input.pid AND payments.xmin::text::bigint = input.version
RETURNING payments.account_id, payments.id, input.key_id
), audit AS (
    INSERT INTO audit_events (account_id, object_id, action, request_id,
                              idempotency_key_id, detail)
    SELECT account_id, id, 'payment.charged', 'req_e8oJXKStH4I7DzCaPcWXJdX9', key_id, '{"charge": "ch_jTSo8sJMqW8JXUKh6cdKllwH", "status": "succeeded", "downstream_key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge"}'::jsonb FROM updated
), event AS (
    INSERT INTO events (id, account_id, type, object)
    SELECT 'evt_' || id, account_id, 'payment.succeeded', ('{"id": "' || id || '", "object": "payment", "amount": 1000, "currency": "usd", "status": "succeeded", "capture_method": "automatic", "amount_captured": 1000, "amount_refunded": 0, "refunded": false, "payment_method": "pm_card_visa", "description": null, "metadata": {}, "receipt_email": null, "processor_charge_id": "ch_jTSo8sJMqW8JXUKh6cdKllwH", "failure_code": null, "failure_message": null, "cancellation_reason": null, "created": 1764500000, "livemode": false}')::jsonb FROM updated
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
      FROM updated
     WHERE idempotency_keys.id = updated.key_id AND owner_token = 'c0a80101-0000-4000-8000-000000000001' AND recovery_point = 'payment_created'
    RETURNING idempotency_keys.id
)
SELECT count(fence.id) FROM updated LEFT JOIN fence ON fence.id = updated.key_id;
