-- no-transaction
-- The event list filtered by type, in (xid, seq) order (see 20261203000100_events_commit_order_index.sql,
-- whose notes on CONCURRENTLY hold here too): replaces events_account_type_seq_idx. If it fails,
-- drop the INVALID index it leaves (`DROP INDEX CONCURRENTLY events_account_type_commit_idx`) and
-- run the migrations again.
CREATE INDEX CONCURRENTLY events_account_type_commit_idx
    ON events (account_id, type, (coalesce(xid, '0'::xid8)) DESC, seq DESC);
