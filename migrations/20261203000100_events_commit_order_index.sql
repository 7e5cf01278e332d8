-- no-transaction
-- The event list in (xid, seq) order, newest first (see 20261203000000_events_commit_order.sql):
-- replaces events_account_seq_idx, dropped in 20261203000300_events_seq_indexes_dropped.sql. The
-- expression is the one the list orders by, NULL (a row older than the column) read as xid 0.
--
-- CONCURRENTLY, so outside the migration's transaction (hence the first line, and one statement
-- per file: a string of several statements runs as one implicit transaction): a plain CREATE
-- INDEX holds a SHARE lock for the whole build, and every phase that writes an event would wait
-- behind it. If it fails, it leaves an INVALID index of this name behind; drop it
-- (`DROP INDEX CONCURRENTLY events_account_commit_idx`) and run the migrations again.
CREATE INDEX CONCURRENTLY events_account_commit_idx
    ON events (account_id, (coalesce(xid, '0'::xid8)) DESC, seq DESC);
