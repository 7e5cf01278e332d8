-- The foreign call an unfinished key is about to make, frozen by the phase that moved the key to
-- the recovery point before the call (docs/decisions.md, "frozen downstream requests"): every
-- attempt, by any process and any release, sends exactly this request. Opaque to the engine: the
-- operation that planned it reads it back. NULL at a recovery point that makes no call.
ALTER TABLE idempotency_keys ADD COLUMN planned_call jsonb;

-- When the latest attempt at the planned call began, by the database clock: stamped by the phase
-- that planned it and again, fenced on the lease, right before every later attempt. An operation
-- that cannot learn the call's outcome looks the object up at the processor and trusts a "not
-- found" only once this is old enough (docs/decisions.md, "when the processor cannot tell us").
ALTER TABLE idempotency_keys ADD COLUMN called_at timestamptz;
