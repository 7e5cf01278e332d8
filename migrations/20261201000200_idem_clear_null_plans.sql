-- A key stored with a JSON `null` as its frozen call (only `plan_of`'s fallback, before
-- 20261201000100, could write one) has no frozen call: say so the way every other key does.
UPDATE idempotency_keys SET planned_call = NULL WHERE planned_call = 'null'::jsonb;
