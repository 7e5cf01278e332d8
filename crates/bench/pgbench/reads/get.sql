-- The floor of `get`: GET /v1/payments/{id} is one point read of the payment, by id and account
-- (the API also checks the API key, which this floor leaves out). The ids are those the API's run
-- asks for, numbered in `bench_cursors` (made by payments-bench).
--
-- Variables: account, ncursors.
\set c random(1, :ncursors)
SELECT p.* FROM payments p
 WHERE p.id = (SELECT id FROM bench_cursors WHERE scenario = 'get' AND n = :c)
   AND p.account_id = :account;
