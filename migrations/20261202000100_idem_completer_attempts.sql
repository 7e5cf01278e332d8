-- The completer's own attempts at a key, apart from `attempts` (every lease of the key: the claim,
-- each client retry that resumed or took it over, each completer run). `worker.max_attempts`
-- bounds the completer's runs only: a client may retry a key as often as it likes, and those
-- retries must not spend the completer's budget (a key a client retried through an outage would
-- otherwise be flagged for a person the first time the completer saw it, never driven).
-- Incremented by the completer's take (crates/idem/src/store/sweep.rs, `take_due`); `attempts`
-- still counts every attempt, for the record.
--
-- A constant default and no CHECK: adding the column rewrites and scans nothing, so the table's
-- exclusive lock is held for an instant; and a lock that cannot be had soon (a long transaction on
-- the table ahead of it, behind which every claim would queue) fails the migration instead, to be
-- run again. A release that does not know the column leaves it at 0 (its own completer still
-- flags by `attempts`). Keys unfinished when it is added start at 0: the completer gives each its
-- full budget again, which costs some runs and flags nothing too early.
SET LOCAL lock_timeout = '5s';
ALTER TABLE idempotency_keys ADD COLUMN completer_attempts integer NOT NULL DEFAULT 0;
