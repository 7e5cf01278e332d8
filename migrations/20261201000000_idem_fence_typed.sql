-- The two moves of a stored key, as functions with typed arguments: `idem_advance` (to the next
-- recovery point, with the frozen call planned there, the lease renewed) and `idem_finish` (the
-- final answer stored, the lease dropped), both fenced on the owner token and the expected
-- recovery point. Each returns the key's id, or NULL when this lease no longer holds the key at
-- `expected`: the caller decides what a lost lease means.
--
-- A phase of several statements (`Lease::phase`, crates/idem/src/engine/operation.rs) calls them
-- directly with typed parameters: no JSON to build on our side or to parse on the server's, and
-- the answer's body travels as bytes, not as hex inside JSON. `idem_commit(fence jsonb)` stays
-- the one entry point of one-statement phases (an operation's CTE passes it the engine's fence
-- without knowing what is in it); for a stored key it now unpacks the fence and calls these, so
-- each move is written once.

CREATE FUNCTION idem_advance(key_id bigint, token uuid, expected text, next_point text,
                             plan jsonb, lease_ms float8) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    moved bigint;
BEGIN
    UPDATE idempotency_keys
       SET recovery_point = next_point,
           locked_until = now() + lease_ms * interval '1 millisecond',
           last_run_at = now(), planned_call = plan, unresolved_at = NULL
     WHERE id = key_id AND owner_token = token AND recovery_point = expected
    RETURNING id INTO moved;
    RETURN moved;
END
$$;

CREATE FUNCTION idem_finish(key_id bigint, token uuid, expected text, status smallint,
                            headers jsonb, body bytea) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    finished bigint;
BEGIN
    UPDATE idempotency_keys
       SET recovery_point = 'finished', owner_token = NULL, locked_until = NULL,
           response_status = status, response_headers = headers, response_body = body,
           completed_at = now(), last_run_at = now(), last_error = NULL
     WHERE id = key_id AND owner_token = token AND recovery_point = expected
    RETURNING id INTO finished;
    RETURN finished;
END
$$;

CREATE OR REPLACE FUNCTION idem_commit(fence jsonb) RETURNS bigint
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
        committed := idem_finish((fence ->> 'key_id')::bigint, (fence ->> 'token')::uuid,
                                 fence ->> 'expected', (response ->> 'status')::smallint,
                                 response -> 'headers', decode(response ->> 'body', 'hex'));
    ELSE
        committed := idem_advance((fence ->> 'key_id')::bigint, (fence ->> 'token')::uuid,
                                  fence ->> 'expected', fence ->> 'next', plan,
                                  (fence ->> 'lease_ms')::float8);
    END IF;
    IF committed IS NULL THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', fence ->> 'key_id'
            USING ERRCODE = 'IL001';
    END IF;
    RETURN committed;
END
$$;
