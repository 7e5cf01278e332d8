-- The floor of `list`: a page of 100 payments of an account, older than a cursor payment deep in
-- the account (`starting_after`), walking the account's index (account_id, created_at DESC,
-- seq DESC) from the cursor's place, and one row more to tell whether more lie beyond.
--
-- Variables: account, ncursors.
\set c random(1, :ncursors)
WITH cursor AS (
    SELECT created_at, seq FROM payments
     WHERE id = (SELECT id FROM bench_cursors WHERE scenario = 'list' AND n = :c)
       AND account_id = :account
)
SELECT p.* FROM payments p
 WHERE p.account_id = :account
   AND (p.created_at, p.seq) < ((SELECT created_at FROM cursor), (SELECT seq FROM cursor))
 ORDER BY p.created_at DESC, p.seq DESC
 LIMIT 101;
