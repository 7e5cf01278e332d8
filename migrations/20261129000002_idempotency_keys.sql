-- Idempotency keys: one row per (account, key), the recovery point the operation has reached, its
-- lease, and once final, the stored response that every later request with the key replays.
-- All times come from the database clock.

CREATE TABLE idempotency_keys (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The scope: keys of two accounts never meet. (No foreign key: the engine is generic, and
    -- accounts are never deleted.)
    account_id        text NOT NULL,
    idempotency_key   text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    -- SHA-256 over method, path, query, media type, version header and canonical body.
    fingerprint       bytea NOT NULL CHECK (length(fingerprint) = 32),
    request_method    text NOT NULL,
    request_path      text NOT NULL,
    -- The request id of the first request, kept in stored problem bodies.
    request_id        text NOT NULL,
    -- Which operation the key runs, and its input, so the completer can resume without HTTP.
    operation         text NOT NULL,
    request_params    jsonb NOT NULL,

    recovery_point    text NOT NULL DEFAULT 'started',
    -- The lease: whoever holds owner_token may commit phases; after locked_until another
    -- process may take the key over with a new token. Both NULL when released.
    owner_token       uuid,
    locked_until      timestamptz,
    attempts          integer NOT NULL DEFAULT 1 CHECK (attempts >= 0),
    last_run_at       timestamptz NOT NULL DEFAULT now(),
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    last_error        text,
    -- Set when automatic retries must stop (too many attempts, or older than the processor's
    -- own idempotency window); a person decides what happens next.
    needs_human_at    timestamptz,

    response_status   smallint CHECK (response_status BETWEEN 100 AND 599),
    response_headers  jsonb,
    response_body     bytea,
    completed_at      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT idempotency_keys_account_key UNIQUE (account_id, idempotency_key),
    CONSTRAINT idempotency_keys_lease_whole CHECK ((owner_token IS NULL) = (locked_until IS NULL)),
    CONSTRAINT idempotency_keys_final_whole CHECK (
        (completed_at IS NULL AND response_status IS NULL AND response_body IS NULL)
        OR (completed_at IS NOT NULL AND response_status IS NOT NULL AND response_body IS NOT NULL
            AND owner_token IS NULL AND recovery_point = 'finished'))
);

-- The completer's queue: unfinished keys that no person has to look at, by due time.
CREATE INDEX idempotency_keys_due_idx ON idempotency_keys (next_attempt_at)
    WHERE completed_at IS NULL AND needs_human_at IS NULL;

-- The reaper's queue: completed keys by age.
CREATE INDEX idempotency_keys_completed_idx ON idempotency_keys (created_at)
    WHERE completed_at IS NOT NULL;
