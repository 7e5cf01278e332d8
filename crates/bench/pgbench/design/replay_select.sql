-- Copied unchanged below this header from shared/bench-floor/replay_select.sql (the steering repository's
-- design floor, issue #18) so that `make bench` does not depend on ../shared at run time.
-- Refresh by copying the file again; never edit the SQL here.
-- The floor of a replay: one point SELECT of a completed key (what must be read to answer).
\set i random(1, :nkeys)
SELECT fingerprint, recovery_point, locked_until, response_status, response_headers, response_body
  FROM idempotency_keys WHERE account_id = 1 AND idem_key = 'replay-' || :i;
