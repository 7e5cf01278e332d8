-- Copied unchanged below this header from shared/bench-floor/seed_replay.sql (the steering repository's
-- design floor, issue #18) so that `make bench` does not depend on ../shared at run time.
-- Refresh by copying the file again; never edit the SQL here.
-- Completed keys for the replay floor: account 1, keys replay-1 .. replay-:nkeys.
DELETE FROM idempotency_keys WHERE account_id = 1 AND idem_key LIKE 'replay-%';
INSERT INTO idempotency_keys (account_id, idem_key, fingerprint, method, path, recovery_point,
                              response_status, response_headers, response_body)
SELECT 1, 'replay-' || i, sha256(('fp' || i)::bytea), 'POST', '/v1/payments', 'finished', 201,
       '{"content-type":"application/json","location":"/v1/payments/pay_x"}',
       convert_to(repeat('x', 420), 'UTF8')
FROM generate_series(1, :nkeys) AS i;
VACUUM ANALYZE idempotency_keys;
