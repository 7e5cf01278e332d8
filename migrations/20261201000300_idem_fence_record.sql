-- The fence of a new key and of a one-statement phase as one typed value, `idem_fence`, and the
-- function that commits it, `idem_commit_fence`: what `idem_commit(jsonb)` does, without the
-- JSON. The engine builds the record (crates/idem/src/store/mod.rs, `FenceRecord`), an
-- operation's statement passes it through unopened, and it reaches the server as binary fields:
-- no JSON to build on our side, none to parse here, and the fingerprint and the answer's body
-- travel as bytes, not as hex.
--
-- The fields, as in idem_commit's fence:
--   key_id, token, expected, lease_ms, next_point: the key, the lease, the recovery point the
--     phase starts from, how long the renewed lease lasts, the point it moves to;
--   plan: the frozen foreign call at `next_point` (or NULL);
--   status, headers, body: the final answer, when the phase stores one (status NULL otherwise);
--   account_id … params: the key's own columns when it is new (account_id NULL for a stored
--     key): the row is inserted here with the id the claim reserved, and a concurrent request
--     with the same key waits on the unique index, then one of the two fails with a unique
--     violation (23505), which rolls its whole phase back.
-- Returns the key's id. A stored key that this lease no longer holds at `expected` raises
-- SQLSTATE IL001, which rolls back the statement and its transaction.
--
-- `idem_commit(jsonb)` stays for a release that still sends JSON (a rolling deploy).
CREATE TYPE idem_fence AS (
    key_id           bigint,
    token            uuid,
    expected         text,
    lease_ms         float8,
    next_point       text,
    plan             jsonb,
    status           smallint,
    headers          jsonb,
    body             bytea,
    account_id       text,
    idempotency_key  text,
    fingerprint      bytea,
    method           text,
    path             text,
    request_id       text,
    operation        text,
    params           jsonb
);

CREATE FUNCTION idem_commit_fence(fence idem_fence) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    committed bigint;
BEGIN
    IF fence.account_id IS NOT NULL THEN
        INSERT INTO idempotency_keys
            (id, account_id, idempotency_key, fingerprint, request_method, request_path,
             request_id, operation, request_params, recovery_point, planned_call, owner_token,
             locked_until, response_status, response_headers, response_body, completed_at)
        OVERRIDING SYSTEM VALUE
        VALUES (fence.key_id, fence.account_id, fence.idempotency_key, fence.fingerprint,
                fence.method, fence.path, fence.request_id, fence.operation, fence.params,
                CASE WHEN fence.status IS NULL THEN fence.next_point ELSE 'finished' END,
                CASE WHEN fence.status IS NULL THEN fence.plan END,
                CASE WHEN fence.status IS NULL THEN fence.token END,
                CASE WHEN fence.status IS NULL
                     THEN now() + fence.lease_ms * interval '1 millisecond' END,
                fence.status, fence.headers, fence.body,
                CASE WHEN fence.status IS NOT NULL THEN now() END)
        RETURNING id INTO committed;
    ELSIF fence.status IS NOT NULL THEN
        committed := idem_finish(fence.key_id, fence.token, fence.expected, fence.status,
                                 fence.headers, fence.body);
    ELSE
        committed := idem_advance(fence.key_id, fence.token, fence.expected, fence.next_point,
                                  fence.plan, fence.lease_ms);
    END IF;
    IF committed IS NULL THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', fence.key_id
            USING ERRCODE = 'IL001';
    END IF;
    RETURN committed;
END
$$;
