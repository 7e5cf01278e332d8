-- Lists are ordered by what the client sees: `created` (created_at), newest first, with `seq`
-- breaking ties. `seq` alone is insertion order, and a payment whose transaction began earlier
-- (an older `created`) could be inserted after one that began later; a list walked newest first
-- then met a `created` older than the next one's.
--
-- These indexes let every page walk (account, created_at, seq) from its cursor and stop after
-- `limit + 1` rows; the old (…, seq) indexes served only the old order.

CREATE INDEX payments_account_created_seq_idx ON payments (account_id, created_at DESC, seq DESC);
DROP INDEX payments_account_seq_idx;

CREATE INDEX refunds_payment_created_seq_idx ON refunds (payment_id, created_at DESC, seq DESC);
DROP INDEX refunds_payment_seq_idx;
