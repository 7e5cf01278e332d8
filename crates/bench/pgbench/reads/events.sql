-- The floor of `events`: a poller's next page of 100 of its account's events, newer than the last
-- one it saw (`ending_before`), walking the feed's index (account_id, writing transaction, seq)
-- from the cursor's place, and one row more to tell whether more lie beyond.
--
-- Variables: account, ncursors.
\set c random(1, :ncursors)
WITH cursor AS (
    SELECT coalesce(xid, '0') AS xid, seq FROM events
     WHERE id = (SELECT id FROM bench_cursors WHERE scenario = 'events' AND n = :c)
       AND account_id = :account
)
SELECT e.id, e.type, e.object, e.created_at FROM events e
 WHERE e.account_id = :account
   AND (coalesce(e.xid, '0'), e.seq) > ((SELECT xid FROM cursor), (SELECT seq FROM cursor))
 ORDER BY coalesce(e.xid, '0'), e.seq
 LIMIT 101;
