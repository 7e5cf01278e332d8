-- The completer's own attempts at a key, apart from `attempts` (every lease of the key: the claim,
-- each client retry that resumed or took it over, each completer run). `worker.max_attempts`
-- bounds the completer's runs only: a client may retry a key as often as it likes, and those
-- retries must not spend the completer's budget (a key a client retried through an outage would
-- otherwise be flagged for a person the first time the completer saw it, never driven).
-- Incremented by the completer's take (crates/idem/src/store/sweep.rs, `take_due`); `attempts`
-- still counts every attempt, for the record.
--
-- A constant default: adding the column rewrites nothing. A release that does not know the
-- column leaves it at 0 (its own completer still flags by `attempts`).
ALTER TABLE idempotency_keys
    ADD COLUMN completer_attempts integer NOT NULL DEFAULT 0 CHECK (completer_attempts >= 0);

-- Unfinished keys carry their completer runs so far: the attempts it logged (no request id).
UPDATE idempotency_keys k
   SET completer_attempts = c.runs
  FROM (SELECT a.key_id, count(*)::int AS runs
          FROM idempotency_attempts a
         WHERE a.request_id IS NULL
         GROUP BY a.key_id) c
 WHERE c.key_id = k.id AND k.completed_at IS NULL;
