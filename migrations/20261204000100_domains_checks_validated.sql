-- The three table checks the previous migration added again `NOT VALID` are validated here, in a
-- transaction of their own: `VALIDATE CONSTRAINT` reads every row under a lock that lets reads and
-- writes go on (SHARE UPDATE EXCLUSIVE), where re-creating them there would have read every row
-- under an exclusive one.
SET LOCAL lock_timeout = '5s';
ALTER TABLE payments VALIDATE CONSTRAINT payments_check, VALIDATE CONSTRAINT payments_check1;
ALTER TABLE idempotency_keys VALIDATE CONSTRAINT idempotency_keys_final_whole;
