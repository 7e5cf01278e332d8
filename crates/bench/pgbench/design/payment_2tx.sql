-- Copied unchanged below this header from shared/bench-floor/payment_2tx.sql (the steering repository's
-- design floor, issue #18) so that `make bench` does not depend on ../shared at run time.
-- Refresh by copying the file again; never edit the SQL here.
-- The floor of POST /v1/payments with a fresh key: the two database transactions of the
-- design with no processor call in between (pgbench -M prepared; one pgbench "transaction"
-- = one request = two SQL transactions, 2 + 3 statements).
\set acct random(1, 100)
\set r random(1, 4611686018427387903)
\set tok random(1, 4611686018427387903)
-- tx1: claim the key (the database decides the race) + insert the payment as processing
BEGIN;
INSERT INTO idempotency_keys (account_id, idem_key, fingerprint, method, path, recovery_point,
                              owner_token, locked_until)
VALUES (:acct, 'k-' || :client_id || '-' || :r, sha256(:r::text::bytea), 'POST', '/v1/payments',
        'payment_created', md5(:tok::text)::uuid, now() + interval '30 seconds')
ON CONFLICT (account_id, idem_key) DO NOTHING
RETURNING id AS kid \gset
INSERT INTO payments (id, account_id, amount, currency, payment_method, status)
VALUES ('pay_' || :r, :acct, 500, 'usd', 'pm_card_visa', 'processing');
COMMIT;
-- tx2: update the payment, stage a job, store the final response and release the lease (fenced)
BEGIN;
UPDATE payments SET status = 'succeeded', amount_captured = amount,
       processor_charge_id = 'ch_' || :r, version = version + 1
 WHERE id = 'pay_' || :r;
INSERT INTO jobs (kind, payload) VALUES ('receipt', jsonb_build_object('payment', 'pay_' || :r));
UPDATE idempotency_keys
   SET recovery_point = 'finished', response_status = 201,
       response_headers = '{"content-type":"application/json","location":"/v1/payments/pay_x"}',
       response_body = convert_to(repeat('x', 420), 'UTF8'), locked_until = NULL, owner_token = NULL
 WHERE id = :kid AND owner_token = md5(:tok::text)::uuid AND recovery_point = 'payment_created';
COMMIT;
