-- The fence of every phase as one function (crates/idem/src/store.rs, `commit`), so that a phase
-- can be a single statement: an operation's data-modifying CTE calls it beside its own writes, and
-- the statement commits all of them or nothing (docs/key-table.md, "The fence").
--
-- `fence` is built by the engine and opaque to the operation:
--   key_id, token, expected, lease_ms, next: the key, the lease, the recovery point the phase
--     starts from, how long the renewed lease lasts, the point it moves to;
--   plan: the frozen foreign call at `next` (or null);
--   response: {status, headers, body (hex)} when the phase stores the final answer;
--   new: {account_id, key, fingerprint (hex), method, path, request_id, operation, params} when
--     the key is new: the row is inserted here, after the phase's writes, with the id the claim
--     reserved. The fence is then the fact that it is new: a concurrent request with the same key
--     waits on the unique index and one of the two fails with a unique violation (23505), which
--     rolls its whole phase back.
-- Returns the key's id. A stored key that this lease no longer holds at `expected` raises
-- SQLSTATE IL001 ("idempotency lease lost"), which rolls back the statement and its transaction.
CREATE FUNCTION idem_commit(fence jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    committed bigint;
    new_key   jsonb := fence -> 'new';
    response  jsonb := nullif(fence -> 'response', 'null'::jsonb);
    plan      jsonb := nullif(fence -> 'plan', 'null'::jsonb);
    lease     interval := (fence ->> 'lease_ms')::float8 * interval '1 millisecond';
BEGIN
    IF new_key IS NOT NULL AND new_key <> 'null'::jsonb THEN
        INSERT INTO idempotency_keys
            (id, account_id, idempotency_key, fingerprint, request_method, request_path,
             request_id, operation, request_params, recovery_point, planned_call, owner_token,
             locked_until, response_status, response_headers, response_body, completed_at)
        OVERRIDING SYSTEM VALUE
        VALUES ((fence ->> 'key_id')::bigint, new_key ->> 'account_id', new_key ->> 'key',
                decode(new_key ->> 'fingerprint', 'hex'), new_key ->> 'method',
                new_key ->> 'path', new_key ->> 'request_id', new_key ->> 'operation',
                new_key -> 'params',
                CASE WHEN response IS NULL THEN fence ->> 'next' ELSE 'finished' END,
                CASE WHEN response IS NULL THEN plan END,
                CASE WHEN response IS NULL THEN (fence ->> 'token')::uuid END,
                CASE WHEN response IS NULL THEN now() + lease END,
                (response ->> 'status')::smallint, response -> 'headers',
                decode(response ->> 'body', 'hex'),
                CASE WHEN response IS NOT NULL THEN now() END)
        RETURNING id INTO committed;
    ELSIF response IS NOT NULL THEN
        UPDATE idempotency_keys
           SET recovery_point = 'finished', owner_token = NULL, locked_until = NULL,
               response_status = (response ->> 'status')::smallint,
               response_headers = response -> 'headers',
               response_body = decode(response ->> 'body', 'hex'),
               completed_at = now(), last_run_at = now(), last_error = NULL
         WHERE id = (fence ->> 'key_id')::bigint AND owner_token = (fence ->> 'token')::uuid
           AND recovery_point = fence ->> 'expected'
        RETURNING id INTO committed;
    ELSE
        UPDATE idempotency_keys
           SET recovery_point = fence ->> 'next', locked_until = now() + lease,
               last_run_at = now(), planned_call = plan, unresolved_at = NULL
         WHERE id = (fence ->> 'key_id')::bigint AND owner_token = (fence ->> 'token')::uuid
           AND recovery_point = fence ->> 'expected'
        RETURNING id INTO committed;
    END IF;
    IF committed IS NULL THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', fence ->> 'key_id'
            USING ERRCODE = 'IL001';
    END IF;
    RETURN committed;
END
$$;
