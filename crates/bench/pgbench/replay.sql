-- The floor of `replay`: the one statement a replay costs payments-api (the claim, which checks
-- the API key, finds the completed key and reads its stored answer), with the key of one of
-- the payments payments-bench created for `replay` (their keys are the numbers 0 to
-- replay_keys - 1). The claim's text is the API's (crates/idem/src/store.rs, insert_or_read).
--
-- Variables: account, key_hash, replay_keys (set by payments-bench).
\set i random(0, :replay_keys - 1)

WITH principal AS (
    SELECT 1 AS live
     WHERE :key_hash::bytea IS NULL
        OR EXISTS (SELECT 1 FROM api_keys
                    WHERE key_hash = :key_hash AND account_id = :account AND revoked_at IS NULL)
), inserted AS (
    INSERT INTO idempotency_keys
        (account_id, idempotency_key, fingerprint, request_method, request_path,
         request_id, operation, request_params, owner_token, locked_until)
    SELECT :account, :i, '\x48050fa388fc8e73de7a7ad6c86da03c0cf50ba33cf761f23b79348878a1b3d0'::bytea, 'POST', '/v1/payments', 'req_e8oJXKStH4I7DzCaPcWXJdX9', 'payments.create', '{"request": {"amount": 1000, "currency": "usd", "metadata": null, "description": null, "receipt_email": null, "capture_method": "automatic", "payment_method": "pm_card_visa"}, "account_id": "acct_7wn1R90iSiclhJyOLPAfILxt"}'::jsonb, 'c0a80101-0000-4000-8000-000000000001'::uuid,
           now() + 60000 * interval '1 millisecond'
      FROM principal
    ON CONFLICT (account_id, idempotency_key) DO NOTHING
    RETURNING id
)
SELECT k.id AS id, k.inserted, k.fingerprint, k.request_method, k.request_path,
       k.request_id, k.operation, k.request_params, k.owner_token, k.lease_active,
       k.needs_human, k.response_status, k.response_headers, k.response_body
  FROM principal
  LEFT JOIN LATERAL (
    SELECT id, true AS inserted, '\x00'::bytea AS fingerprint, 'POST'::text AS request_method,
           '/v1/payments'::text AS request_path, 'req'::text AS request_id,
           'payments.create'::text AS operation, '{}'::jsonb AS request_params,
           'c0a80101-0000-4000-8000-000000000001'::uuid AS owner_token, true AS lease_active,
           false AS needs_human, NULL::smallint AS response_status,
           NULL::jsonb AS response_headers, NULL::bytea AS response_body
      FROM inserted
    UNION ALL
    SELECT k.id, false, k.fingerprint, k.request_method, k.request_path, k.request_id,
           k.operation, k.request_params, k.owner_token,
           coalesce(k.locked_until > now(), false), k.needs_human_at IS NOT NULL,
           k.response_status, k.response_headers, k.response_body
      FROM idempotency_keys k
     WHERE k.account_id = :account AND k.idempotency_key = :i::text
       AND NOT EXISTS (SELECT 1 FROM inserted)
  ) k ON true;
