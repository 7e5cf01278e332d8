-- The reaper counts retention from completion (`completed_at`), not creation: a key the completer
-- finished late must replay its answer for the whole retention window. Its queue follows.

DROP INDEX idempotency_keys_completed_idx;

CREATE INDEX idempotency_keys_completed_idx ON idempotency_keys (completed_at)
    WHERE completed_at IS NOT NULL;
