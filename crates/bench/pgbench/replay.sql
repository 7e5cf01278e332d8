-- The floor of `replay`: the one statement a replay of a payment costs payments-api when it reads
-- its key: the claim with the first phase (crates/domain/src/payments/store.rs,
-- `insert_claiming`; `idem_claim` checks the API key, finds the completed key and reads its
-- stored answer, so the statement writes nothing), with the key of one of the payments
-- payments-bench created for `replay` (their keys are the numbers 0 to replay_keys - 1). A replay
-- whose answer the API keeps in memory sends instead a share of one smaller statement (`fresh`),
-- so this floor is the same SQL as a replay of a key the process has not replayed before. The
-- text is new.sql's first statement.
--
-- Variables: account, key_hash, replay_keys (set by payments-bench).
\set i random(0, :replay_keys - 1)

WITH claim AS (
    SELECT idem_claim(:account, :i::text, :key_hash, ROW(NULL, 'c0a80101-0000-4000-8000-000000000001', 'started', 60000, 'payment_created', '{"path": "/v1/charges", "key": "pay_PTVNNLIEKaN2kLLdZ7l31Kon/charge", "params": [["amount", "1000"], ["currency", "usd"], ["source", "pm_card_visa"], ["capture", "true"], ["metadata[payment_id]", "pay_PTVNNLIEKaN2kLLdZ7l31Kon"]]}', NULL, NULL, NULL, :account, :i::text, decode('48050fa388fc8e73de7a7ad6c86da03c0cf50ba33cf761f23b79348878a1b3d0', 'hex'), 'POST', '/v1/payments', 'req_e8oJXKStH4I7DzCaPcWXJdX9', 'payments.create', '{"request": {"amount": 1000, "currency": "usd", "metadata": null, "description": null, "receipt_email": null, "capture_method": "automatic", "payment_method": "pm_card_visa"}, "account_id": "acct_7wn1R90iSiclhJyOLPAfILxt"}')::idem_fence) AS claimed
), payment AS (
    INSERT INTO payments (id, account_id, idempotency_key_id, amount, currency, status,
                          capture_method, payment_method, description, metadata,
                          receipt_email)
    SELECT 'pay_' || :i, :account, (claimed).id, 1000, 'usd', 'processing', 'automatic', 'pm_card_visa', NULL, '{}', NULL
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
  FROM claim LEFT JOIN payment p ON true;
