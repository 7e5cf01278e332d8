-- Every attempt at a key after the first: a retry that resumed a released key or took over one
-- whose holder's lease had expired, or a run of the completer. Written by the same statement that
-- takes the lease (crates/idem/src/store.rs), so it costs no round trip; the inspector shows them
-- on the key's timeline. The rows go with their key when the reaper deletes it.
CREATE TABLE idempotency_attempts (
    key_id          bigint NOT NULL REFERENCES idempotency_keys (id) ON DELETE CASCADE,
    attempt         integer NOT NULL,
    -- The request that made the attempt; NULL for the completer.
    request_id      text,
    -- True when the previous holder still held the lease and it had expired (a crash or a hang);
    -- false when the key had been released after a transient failure.
    took_over       boolean NOT NULL,
    -- Where the attempt started.
    recovery_point  text NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key_id, attempt)
);
