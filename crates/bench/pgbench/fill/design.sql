-- The design floor's tables filled to the same number of payments as the project's
-- (`fill/project.sql`), in the same chunks `{{lo}}`..`{{hi}}` of `{{n}}`: the minimal schema keeps
-- every key (it has no reaper), every payment and every job, over accounts 1 to 100, with the
-- shapes and sizes of `design/seed_replay.sql` and `design/payment_2tx.sql`.

-- part: chunk
INSERT INTO idempotency_keys (account_id, idem_key, fingerprint, method, path, recovery_point,
                              response_status, response_headers, response_body, created_at)
SELECT i % 100 + 1, 'fill-' || i, sha256(('fp' || i)::bytea), 'POST', '/v1/payments', 'finished',
       201, '{"content-type":"application/json","location":"/v1/payments/pay_x"}',
       convert_to(repeat('x', 420), 'UTF8'),
       now() - interval '1 hour' - ({{n}} - i) * (interval '365 days' / {{n}})
  FROM generate_series({{lo}}, {{hi}}) i;
INSERT INTO payments (id, account_id, amount, currency, payment_method, status, amount_captured,
                      processor_charge_id, created)
SELECT 'pay_fill' || i, i % 100 + 1, 500, 'usd', 'pm_card_visa', 'succeeded', 500, 'ch_fill' || i,
       now() - interval '1 hour' - ({{n}} - i) * (interval '365 days' / {{n}})
  FROM generate_series({{lo}}, {{hi}}) i;
INSERT INTO jobs (kind, payload, created_at)
SELECT 'receipt', jsonb_build_object('payment', 'pay_fill' || i),
       now() - interval '1 hour' - ({{n}} - i) * (interval '365 days' / {{n}})
  FROM generate_series({{lo}}, {{hi}}) i;
