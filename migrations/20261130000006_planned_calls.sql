-- The foreign call an unfinished key is about to make, frozen by the phase that moved the key to
-- the recovery point before the call (docs/decisions.md §8a): every attempt, by any process and
-- any release, sends exactly this request. Opaque to the engine: the operation that planned it
-- reads it back. NULL at a recovery point that makes no call.
ALTER TABLE idempotency_keys ADD COLUMN planned_call jsonb;

-- When the operation first met an answer that cannot tell it what the planned call did (the
-- processor refuses the key as reused, or replays a failure it kept for it) and a lookup found
-- nothing, by the database clock. Whatever the call made was made before that answer; a lookup
-- that finds nothing is trusted only once this is older than the longest call plus the
-- processor's search lag (docs/decisions.md §8b). Cleared whenever a new call is planned.
ALTER TABLE idempotency_keys ADD COLUMN unresolved_at timestamptz;
