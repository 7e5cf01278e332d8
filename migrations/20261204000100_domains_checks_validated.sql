-- After the three migrations that retyped columns as domains (20261204000000_domains_idempotency_keys.sql
-- and the two after it), in a transaction of their own, under locks that let reads and writes go
-- on (SHARE UPDATE EXCLUSIVE):
-- - the planner's statistics of the retyped columns, which a change of type drops, gathered again
--   at once rather than whenever autovacuum next analyzes (without them the planner guesses, and
--   may guess a scan of a whole table for a lookup);
-- - the three table checks those migrations added again `NOT VALID`, validated: each reads every
--   row, where re-creating them there would have read every row under an exclusive lock.
SET LOCAL lock_timeout = '5s';
ANALYZE payments, refunds, events, idempotency_keys;
ALTER TABLE payments VALIDATE CONSTRAINT payments_check, VALIDATE CONSTRAINT payments_check1;
ALTER TABLE idempotency_keys VALIDATE CONSTRAINT idempotency_keys_final_whole;
