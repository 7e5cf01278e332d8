-- `idem_advance` as `idem_commit` treats a plan: a JSON `null` is no plan (SQL NULL in
-- `planned_call`), so that `before_call` finds nothing planned and the operation plans the call
-- from its records, instead of finding a `null` it cannot parse. (A migration of its own: the
-- first text of the function was already applied where its release ran.)
CREATE OR REPLACE FUNCTION idem_advance(key_id bigint, token uuid, expected text,
                                        next_point text, plan jsonb, lease_ms float8)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    moved bigint;
BEGIN
    UPDATE idempotency_keys
       SET recovery_point = next_point,
           locked_until = now() + lease_ms * interval '1 millisecond',
           last_run_at = now(), planned_call = nullif(plan, 'null'::jsonb), unresolved_at = NULL
     WHERE id = key_id AND owner_token = token AND recovery_point = expected
    RETURNING id INTO moved;
    RETURN moved;
END
$$;
