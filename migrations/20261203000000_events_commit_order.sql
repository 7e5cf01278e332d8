-- The event feed, gap-free for a poller (crates/domain/src/events.rs, `list`; docs/webhooks.md).
-- `seq` is taken when the row is inserted, not when its transaction commits: a transaction that
-- took seq 10 may commit after one that took seq 11, and a poller that moved its cursor to 11 in
-- between never saw 10. So each event records the transaction that wrote it, and the list walks
-- (xid, seq) and shows only events of transactions older than every transaction still running:
-- an event that commits later has an xid at or above that horizon, so it lands ahead of any
-- cursor the list ever handed out.
--
-- No volatile default in the ADD COLUMN (that would rewrite the table under its exclusive lock):
-- the column is added empty, which rewrites and scans nothing, and the default is set after, for
-- new rows only. Rows already there keep NULL, which the list reads as xid 0, the oldest: the
-- ALTER waits for every transaction that holds the table, so each of them had committed. Nothing
-- is backfilled (an UPDATE of every row under the lock). The new indexes are built by the next
-- migrations, concurrently, and the old ones dropped after them.
--
-- A lock that cannot be had soon (a long transaction on the table ahead of it, behind which
-- every new event would queue) fails the migration instead, to be run again.
SET LOCAL lock_timeout = '5s';
ALTER TABLE events ADD COLUMN xid xid8;
ALTER TABLE events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
