-- The list no longer walks events by seq alone (20261203000000_events_commit_order.sql), and every
-- index costs each new event: the two it used go, now that their replacements exist. A release
-- still serving beside these migrations lists by seq, correctly but without an index of its own
-- (README, "Upgrading"); rolling back to it for good needs them again:
--   CREATE INDEX CONCURRENTLY events_account_seq_idx ON events (account_id, seq DESC);
--   CREATE INDEX CONCURRENTLY events_account_type_seq_idx ON events (account_id, type, seq DESC);
-- Dropping an index takes the table's exclusive lock for an instant; a lock that cannot be had
-- soon fails the migration instead, to be run again.
SET LOCAL lock_timeout = '5s';
DROP INDEX events_account_seq_idx;
DROP INDEX events_account_type_seq_idx;
