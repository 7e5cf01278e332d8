-- A claim's read as one function, `idem_claim`, which a new key's first phase can call too, so that
-- a new payment is two statements and two transactions (issue #18): the claim rides in the first
-- phase. What a claim reads, and why it is safe to store a key by its first phase, is unchanged
-- (docs/decisions.md §1; the read as it was: crates/idem/src/store/claim.rs before this
-- migration).
--
-- idem_claim(for_account, for_key, credential, fence) answers one `idem_claimed` record:
--   - with no fence (NULL): the read alone. It checks the credential (the SHA-256 digest of the
--     API key the request presents; NULL when the caller checked it) against `api_keys`, and reads
--     nothing when it is not a live key of the account (`live` false); reads the key's row (its
--     input only while it is unfinished: a replay never needs it); and for a key it does not find
--     reserves an id from the table's sequence (`reserved`), which the first phase stores it under.
--     With the credentials' version read in the same snapshot, and the database clock.
--   - with the fence of a new key (its account_id set): the same read, and then, when the
--     credential is live and the key absent, the key stored by `idem_commit_fence` under the
--     fence's id, or a new one from the sequence when the fence has none (`stored` true, `id` the
--     key's id). A request with the same key that stores it meanwhile makes the insert wait on the
--     unique index and then fail with a unique violation (23505), which rolls back the caller's
--     whole statement, as before. When the key is there, nothing is written and the read answers
--     as without a fence: the caller's writes, which it makes only `WHERE (claimed).stored`, are
--     not made.
--   - with the fence of a stored key (no account_id): that key's fenced move (idem_commit_fence,
--     SQLSTATE IL001 when the lease is lost), `stored` true; nothing is read. An operation's first
--     phase then runs for a key stored before it (by a release that stored keys at the claim).
CREATE TYPE idem_claimed AS (
    version          uuid,
    now_us           int8,
    live             boolean,
    id               int8,
    fingerprint      bytea,
    request_method   text,
    request_path     text,
    request_id       text,
    operation        text,
    request_params   jsonb,
    owner_token      uuid,
    lease_active     boolean,
    needs_human      boolean,
    response_status  smallint,
    response_headers jsonb,
    response_body    bytea,
    completed_at_us  int8,
    reserved         int8,
    stored           boolean
);

CREATE FUNCTION idem_claim(for_account text, for_key text, credential bytea, fence idem_fence)
RETURNS idem_claimed
LANGUAGE plpgsql AS $$
DECLARE
    claimed idem_claimed;
BEGIN
    IF fence.account_id IS NULL AND fence.key_id IS NOT NULL THEN
        claimed.id := idem_commit_fence(fence);
        claimed.live := true;
        claimed.stored := true;
        RETURN claimed;
    END IF;
    SELECT v.version, (extract(epoch FROM now()) * 1000000)::int8, p.live IS NOT NULL,
           k.id, k.fingerprint, k.request_method, k.request_path, k.request_id, k.operation,
           CASE WHEN k.response_status IS NULL THEN k.request_params END,
           k.owner_token, coalesce(k.locked_until > now(), false), k.needs_human_at IS NOT NULL,
           k.response_status, k.response_headers, k.response_body,
           (extract(epoch FROM k.completed_at) * 1000000)::int8, NULL, false
      INTO claimed
      FROM credentials_version v
      LEFT JOIN (SELECT 1 AS live
                  WHERE credential IS NULL
                     OR EXISTS (SELECT 1 FROM api_keys a
                                 WHERE a.key_hash = credential AND a.account_id = for_account
                                   AND a.revoked_at IS NULL)) p ON true
      LEFT JOIN idempotency_keys k
             ON p.live IS NOT NULL AND k.account_id = for_account AND k.idempotency_key = for_key;
    IF claimed.live AND claimed.id IS NULL THEN
        IF fence.account_id IS NULL THEN
            claimed.reserved := nextval('idempotency_keys_id_seq');
        ELSIF fence.account_id <> for_account OR fence.idempotency_key IS DISTINCT FROM for_key THEN
            RAISE EXCEPTION 'a new key''s fence for another key than the one read';
        ELSE
            fence.key_id := coalesce(fence.key_id, nextval('idempotency_keys_id_seq'));
            claimed.id := idem_commit_fence(fence);
            claimed.stored := true;
        END IF;
    END IF;
    RETURN claimed;
END
$$;
