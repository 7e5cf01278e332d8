-- The floor of `replay`: the one statement a replay costs payments-api (the claim's read, which
-- checks the API key, finds the completed key and reads its stored answer), with the key of one
-- of the payments payments-bench created for `replay` (their keys are the numbers 0 to
-- replay_keys - 1). The read's text is the API's (crates/idem/src/store/claim.rs, `read`).
-- It is what a replay costs when it reads its key; a replay whose answer the API keeps in memory
-- sends instead a share of one smaller statement (`fresh`), so this floor is the same SQL as a
-- replay of a key the process has not replayed before.
--
-- Variables: account, key_hash, replay_keys (set by payments-bench).
\set i random(0, :replay_keys - 1)

WITH principal AS (
    SELECT 1 AS live
     WHERE :key_hash::bytea IS NULL
        OR EXISTS (SELECT 1 FROM api_keys
                    WHERE key_hash = :key_hash AND account_id = :account AND revoked_at IS NULL)
),
version AS (SELECT version FROM credentials_version)
SELECT v.version, (extract(epoch FROM now()) * 1000000)::int8 AS now_us, p.live,
       k.id AS found, k.fingerprint, k.request_method, k.request_path, k.request_id, k.operation,
       CASE WHEN k.response_status IS NULL THEN k.request_params END AS request_params,
       k.owner_token, coalesce(k.locked_until > now(), false) AS lease_active,
       k.needs_human_at IS NOT NULL AS needs_human, k.response_status, k.response_headers,
       k.response_body, (extract(epoch FROM k.completed_at) * 1000000)::int8 AS completed_at_us,
       CASE WHEN p.live IS NOT NULL AND k.id IS NULL
            THEN nextval('idempotency_keys_id_seq') END AS key_id
  FROM version v
  LEFT JOIN principal p ON true
  LEFT JOIN idempotency_keys k
         ON p.live IS NOT NULL AND k.account_id = :account AND k.idempotency_key = :i::text;
