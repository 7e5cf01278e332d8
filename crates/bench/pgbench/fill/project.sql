-- A year of use, as the project's tables hold it after that year with the default retention
-- (`payments-bench --fill N`; BENCHMARKS.md, "At scale"). Set-based, in chunks of payment numbers
-- `{{lo}}`..`{{hi}}` of `{{n}}`; payments-bench replaces the `{{…}}` words and runs the three parts
-- (separated by the `-- part:` lines) in order: `setup` once, `chunk` per chunk, `finish` once.
--
-- Payment `i` (1..n) was made at `t_end - (n - i) × 365 days / n`, by account `i % 100` (0 is the
-- benchmark's own account, the 99 others are made here), so the benchmark's account holds one
-- payment in a hundred. Of every hundred in a row, and of every hundred of an account (by
-- `k = (i / 100 + i) % 100`): 88 succeeded, 4 failed
-- (card declined), 2 were authorized and canceled, 3 succeeded and were refunded, 3 were captured
-- by hand; half carry metadata, a third a description, one in ten a receipt email.
--
-- What a year leaves behind, with the defaults of `[retention]` and `[idempotency]`:
-- - every payment, refund, receipt and audit record (kept a year and more);
-- - events and processor events of the last 29 days (kept 30), a webhook attempt for each event
--   of an account with an endpoint (one event in fifty first failed once);
-- - webhook and receipt jobs finished in the last 6 days (kept 7);
-- - idempotency keys of the last 23 hours (kept 24).
-- Rows are written as the API writes them (same columns, same JSON shapes), with ids of the same
-- length, in the order of their identity (`ORDER BY 1` where a row of a payment becomes several).
-- They land before the rows the running system wrote, in the middle of the indexes on an identity,
-- where a page splits in half: payments-bench rebuilds those indexes after the fill, as the API's
-- appends at their right end would have left them (`fill::both`). Their `seq`/`id` are negative and grow with time, so that every filled row sorts before
-- the rows the running system writes, as older rows do; events have no writing transaction id
-- (`xid` NULL counts as the oldest), so the event feed's order is their time order too.

-- part: setup
CREATE SCHEMA bench_fill;
CREATE TABLE bench_fill.run (n bigint NOT NULL, t_end timestamptz NOT NULL, bench_account text NOT NULL);
INSERT INTO bench_fill.run VALUES ({{n}}, now() - interval '1 hour', '{{account}}');

INSERT INTO accounts (id, name, created_at)
SELECT 'acct_' || substr(md5('acct' || a), 1, 24), 'merchant ' || a, now() - interval '400 days'
  FROM generate_series(1, 99) a;
INSERT INTO api_keys (id, account_id, key_hash, last4, created_at)
SELECT 'key_' || substr(md5('key' || a), 1, 24), 'acct_' || substr(md5('acct' || a), 1, 24),
       sha256(('secret' || a)::bytea), lpad(a::text, 4, '0'), now() - interval '400 days'
  FROM generate_series(1, 99) a;
-- One endpoint per account; the benchmark's is disabled (its history stays, nothing is sent).
INSERT INTO webhook_endpoints (id, account_id, url, enabled_events, secret, status, created_at)
SELECT 'we_' || substr(md5('we' || a), 1, 24),
       CASE WHEN a = 0 THEN r.bench_account ELSE 'acct_' || substr(md5('acct' || a), 1, 24) END,
       'https://merchant-' || a || '.example.com/webhooks', '{*}',
       sha256(('whsec' || a)::bytea) || sha256(('nonce' || a)::bytea),
       CASE WHEN a = 0 THEN 'disabled' ELSE 'enabled' END, now() - interval '400 days'
  FROM bench_fill.run r, generate_series(0, 99) a;

-- Payment `i` as the API would have left it, with its JSON representation.
CREATE FUNCTION bench_fill.payments(lo bigint, hi bigint)
RETURNS TABLE (i bigint, seq bigint, id text, account_id text, created_at timestamptz,
               amount bigint, status text, capture_method text, amount_captured bigint,
               amount_refunded bigint, description text, metadata jsonb, receipt_email text,
               pi text, ch text, failure_code text, failure_message text,
               cancellation_reason text, refunded boolean, json jsonb)
LANGUAGE sql STABLE AS $$
  SELECT p.*, jsonb_build_object(
           'id', p.id, 'amount', p.amount, 'object', 'payment', 'status', p.status,
           'created', extract(epoch FROM p.created_at)::bigint, 'currency', 'usd',
           'livemode', false, 'metadata', p.metadata, 'refunded', p.refunded,
           'description', p.description, 'next_action', NULL, 'failure_code', p.failure_code,
           'receipt_email', p.receipt_email, 'capture_method', p.capture_method,
           'payment_method', 'pm_card_visa', 'amount_captured', p.amount_captured,
           'amount_refunded', p.amount_refunded, 'failure_message', p.failure_message,
           'cancellation_reason', p.cancellation_reason, 'processor_charge_id', p.ch,
           'processor_payment_intent_id', p.pi)
    FROM (
      SELECT i, i - r.n - 1 AS seq,
             'pay_' || substr(md5('pay' || i), 1, 24) AS id,
             CASE WHEN i % 100 = 0 THEN r.bench_account
                  ELSE 'acct_' || substr(md5('acct' || (i % 100)), 1, 24) END AS account_id,
             r.t_end - (r.n - i) * (interval '365 days' / r.n) AS created_at,
             500 + (i * 37) % 20000 AS amount,
             CASE WHEN k < 88 OR k >= 94 THEN 'succeeded' WHEN k < 92 THEN 'failed'
                  ELSE 'canceled' END AS status,
             CASE WHEN k IN (92, 93, 97, 98, 99) THEN 'manual' ELSE 'automatic' END
               AS capture_method,
             CASE WHEN k < 88 OR k >= 94 THEN 500 + (i * 37) % 20000 ELSE 0 END
               AS amount_captured,
             CASE WHEN k BETWEEN 94 AND 96 THEN 500 + (i * 37) % 20000 ELSE 0 END
               AS amount_refunded,
             CASE WHEN k % 3 = 0 THEN 'Order ' || i END AS description,
             CASE WHEN k % 2 = 0 THEN jsonb_build_object('order_id', 'ord_' || i)
                  ELSE '{}'::jsonb END AS metadata,
             CASE WHEN k % 10 = 0 THEN 'customer' || i || '@example.com' END AS receipt_email,
             'pi_' || substr(md5('pi' || i), 1, 24) AS pi,
             CASE WHEN k NOT IN (92, 93) THEN 'ch_' || substr(md5('ch' || i), 1, 24) END AS ch,
             CASE WHEN k BETWEEN 88 AND 91 THEN 'card_declined' END AS failure_code,
             CASE WHEN k BETWEEN 88 AND 91 THEN 'Your card was declined.' END AS failure_message,
             CASE WHEN k IN (92, 93) THEN 'requested_by_customer' END AS cancellation_reason,
             k BETWEEN 94 AND 96 AS refunded
        FROM bench_fill.run r, generate_series(lo, hi) i, LATERAL (SELECT (i / 100 + i) % 100 AS k) kk
    ) p
$$;

-- part: chunk
INSERT INTO payments (seq, id, account_id, idempotency_key_id, amount, currency, status,
                      capture_method, amount_captured, amount_refunded, payment_method,
                      description, metadata, receipt_email, processor_payment_intent_id,
                      processor_charge_id, failure_code, failure_message, cancellation_reason,
                      created_at, updated_at)
OVERRIDING SYSTEM VALUE
SELECT seq, id, account_id, 1000000000000 + i, amount, 'usd', status, capture_method,
       amount_captured, amount_refunded, 'pm_card_visa', description, metadata, receipt_email, pi,
       ch, failure_code, failure_message, cancellation_reason, created_at,
       created_at + interval '40 milliseconds'
  FROM bench_fill.payments({{lo}}, {{hi}});

INSERT INTO refunds (seq, id, account_id, payment_id, idempotency_key_id, amount, currency,
                     status, reason, metadata, processor_refund_id, created_at)
OVERRIDING SYSTEM VALUE
SELECT seq, 're_' || substr(md5('re' || i), 1, 24), account_id, id, 2000000000000 + i, amount,
       'usd', 'succeeded', 'requested_by_customer', '{}', 're_' || substr(md5('pre' || i), 1, 24),
       created_at + interval '10 minutes'
  FROM bench_fill.payments({{lo}}, {{hi}}) WHERE refunded;

-- The payment's audit trail (created, charged) and its refund's (created, succeeded).
INSERT INTO audit_events (id, account_id, object_id, action, request_id, idempotency_key_id,
                          detail, created_at)
OVERRIDING SYSTEM VALUE
SELECT 4 * seq + j, account_id, CASE WHEN j < 2 THEN id ELSE 're_' || substr(md5('re' || i), 1, 24) END,
       (ARRAY['payment.created', 'payment.charged', 'refund.created', 'refund.succeeded'])[j + 1],
       'req_' || substr(md5('req' || i || j), 1, 24),
       CASE WHEN j < 2 THEN 1000000000000 + i ELSE 2000000000000 + i END,
       CASE j WHEN 0 THEN jsonb_build_object('amount', amount, 'currency', 'usd')
              WHEN 1 THEN jsonb_build_object('charge', ch, 'status', status,
                                             'downstream_key', id || '/charge', 'payment_intent', pi)
              WHEN 2 THEN jsonb_build_object('amount', amount, 'payment', id)
              ELSE jsonb_build_object('processor_refund_id', 're_' || substr(md5('pre' || i), 1, 24),
                                      'downstream_key', 're_' || substr(md5('re' || i), 1, 24) || '/refund')
       END,
       created_at + j * interval '10 milliseconds' + (j / 2) * interval '10 minutes'
  FROM bench_fill.payments({{lo}}, {{hi}}), generate_series(0, 3) j
 WHERE j < 2 OR refunded
 ORDER BY 1;

INSERT INTO receipts (payment_id, account_id, email, body, admitted_at, send_attempts, sent_at,
                      created_at)
SELECT id, account_id, receipt_email,
       'Receipt for payment ' || id || E'\n\nAmount: ' || amount / 100 || '.' ||
       lpad((amount % 100)::text, 2, '0') || E' USD\nCard: Visa ending 4242\nDate: ' ||
       to_char(created_at, 'YYYY-MM-DD') || E'\n\nThank you for your purchase.\n' ||
       coalesce(description, ''),
       created_at + interval '1 second', 1, created_at + interval '2 seconds', created_at
  FROM bench_fill.payments({{lo}}, {{hi}}) WHERE receipt_email IS NOT NULL;

-- Keys of the last 23 hours, completed, with their stored answers.
INSERT INTO idempotency_keys (id, account_id, idempotency_key, fingerprint, request_method,
                              request_path, request_id, operation, request_params, recovery_point,
                              attempts, last_run_at, next_attempt_at, response_status,
                              response_headers, response_body, completed_at, created_at,
                              planned_call)
OVERRIDING SYSTEM VALUE
SELECT 1000000000000 + i, account_id, uuid_in(md5('key' || i)::cstring)::text,
       sha256(('fp' || i)::bytea), 'POST', '/v1/payments', 'req_' || substr(md5('req' || i || 0), 1, 24),
       'payments.create',
       jsonb_build_object('request', jsonb_build_object(
           'amount', amount, 'currency', 'usd', 'metadata', metadata, 'description', description,
           'receipt_email', receipt_email, 'capture_method', capture_method,
           'payment_method', 'pm_card_visa'), 'account_id', account_id),
       'finished', 1, created_at, created_at, CASE WHEN status = 'failed' THEN 402 ELSE 201 END,
       jsonb_build_array(jsonb_build_array('content-type', 'application/json'),
                         jsonb_build_array('etag', '"' || substr(md5('etag' || i), 1, 24) || '"'),
                         jsonb_build_array('location', '/v1/payments/' || id)),
       convert_to(json::text, 'UTF8'), created_at + interval '40 milliseconds', created_at,
       jsonb_build_object('key', id || '/charge', 'path', '/v1/payment_intents', 'form',
           jsonb_build_array(jsonb_build_array('amount', amount::text),
                             jsonb_build_array('currency', 'usd'),
                             jsonb_build_array('payment_method', 'pm_card_visa'),
                             jsonb_build_array('confirm', 'true'),
                             jsonb_build_array('capture_method', capture_method),
                             jsonb_build_array('allowed_payment_method_types[0]', 'card'),
                             jsonb_build_array('return_url', 'https://payments.example.com/'),
                             jsonb_build_array('metadata[payment_id]', id)))
  FROM bench_fill.payments({{lo}}, {{hi}}) p, bench_fill.run r
 WHERE p.created_at > r.t_end - interval '23 hours';

-- Events of the last 29 days: the payment's outcome, and its refund's.
INSERT INTO events (seq, id, account_id, type, object, created_at, xid)
OVERRIDING SYSTEM VALUE
SELECT 2 * seq + j, 'evt_' || substr(md5('evt' || i || j), 1, 24), account_id,
       CASE WHEN j = 1 THEN 'refund.succeeded' ELSE 'payment.' || status END,
       CASE WHEN j = 0 THEN json ELSE jsonb_build_object(
           'id', 're_' || substr(md5('re' || i), 1, 24), 'object', 'refund', 'amount', amount,
           'currency', 'usd', 'payment', id, 'status', 'succeeded',
           'reason', 'requested_by_customer', 'metadata', '{}'::jsonb, 'failure_code', NULL,
           'created', extract(epoch FROM created_at + interval '10 minutes')::bigint,
           'processor_refund_id', 're_' || substr(md5('pre' || i), 1, 24)) END,
       created_at + interval '40 milliseconds' + j * interval '10 minutes', NULL
  FROM bench_fill.payments({{lo}}, {{hi}}) p, bench_fill.run r, generate_series(0, 1) j
 WHERE p.created_at > r.t_end - interval '29 days' AND (j = 0 OR refunded)
 ORDER BY 1;

-- Each of those events delivered to its account's endpoint; one in fifty failed once first.
INSERT INTO webhook_attempts (seq, endpoint_id, event_id, attempt, status_code, error,
                              duration_ms, outcome, created_at)
OVERRIDING SYSTEM VALUE
SELECT 2 * e.seq + a, w.id, e.id, a + 1, CASE WHEN a = 0 AND e.seq % 50 = 0 THEN 500 ELSE 200 END,
       NULL, 40 + e.seq % 60, CASE WHEN a = 0 AND e.seq % 50 = 0 THEN 'retrying' ELSE 'delivered' END,
       e.created_at + interval '1 second' + a * interval '30 seconds'
  FROM events e JOIN webhook_endpoints w ON w.account_id = e.account_id, generate_series(0, 1) a
 WHERE e.seq BETWEEN 2 * ({{lo}} - {{n}} - 1) AND 2 * ({{hi}} - {{n}} - 1) + 1
   AND (a = 0 OR e.seq % 50 = 0)
 ORDER BY 1;

-- The jobs of the last 6 days, done: each event's delivery, each receipt.
INSERT INTO jobs (id, kind, dedupe_key, payload, run_at, attempts, done_at, created_at)
OVERRIDING SYSTEM VALUE
SELECT 2 * e.seq, 'webhook', e.id || ':' || w.id,
       jsonb_build_object('event_id', e.id, 'endpoint_id', w.id), e.created_at,
       1 + (e.seq % 50 = 0)::int, e.created_at + interval '1 second', e.created_at
  FROM events e JOIN webhook_endpoints w ON w.account_id = e.account_id, bench_fill.run r
 WHERE e.seq BETWEEN 2 * ({{lo}} - {{n}} - 1) AND 2 * ({{hi}} - {{n}} - 1) + 1
   AND w.status = 'enabled' AND e.created_at > r.t_end - interval '6 days';
INSERT INTO jobs (id, kind, dedupe_key, payload, run_at, attempts, done_at, created_at)
OVERRIDING SYSTEM VALUE
SELECT 4 * seq + 1, 'receipt', id, jsonb_build_object('payment_id', id, 'email', receipt_email),
       created_at, 1, created_at + interval '2 seconds', created_at
  FROM bench_fill.payments({{lo}}, {{hi}}) p, bench_fill.run r
 WHERE receipt_email IS NOT NULL AND p.created_at > r.t_end - interval '6 days';

-- The processor's own webhooks about each charge of the last 29 days.
INSERT INTO processor_events (id, type, object_id, payment_id, downstream_key, object, created,
                              received_at)
SELECT 'evt_' || substr(md5('pevt' || i || j), 1, 24),
       (ARRAY['payment_intent.succeeded', 'charge.succeeded'])[j + 1],
       CASE WHEN j = 0 THEN pi ELSE ch END, id, id || '/charge',
       jsonb_build_object(
           'id', CASE WHEN j = 0 THEN pi ELSE ch END,
           'object', CASE WHEN j = 0 THEN 'payment_intent' ELSE 'charge' END,
           'amount', amount, 'amount_received', amount_captured, 'amount_capturable', 0,
           'currency', 'usd', 'status', 'succeeded', 'capture_method', capture_method,
           'confirmation_method', 'automatic', 'created', extract(epoch FROM created_at)::bigint,
           'livemode', false, 'latest_charge', ch, 'payment_intent', pi,
           'payment_method', 'pm_' || substr(md5('pm' || i), 1, 24),
           'payment_method_types', jsonb_build_array('card'),
           'metadata', jsonb_build_object('payment_id', id), 'next_action', NULL,
           'last_payment_error', NULL, 'description', description,
           'client_secret', pi || '_secret_' || substr(md5('cs' || i), 1, 24)),
       extract(epoch FROM created_at)::bigint, created_at + interval '1 second'
  FROM bench_fill.payments({{lo}}, {{hi}}) p, bench_fill.run r, generate_series(0, 1) j
 WHERE p.created_at > r.t_end - interval '29 days' AND status = 'succeeded' AND ch IS NOT NULL;

-- part: finish
DROP SCHEMA bench_fill CASCADE;

-- part: backlog
-- `{{count}}` completed keys past the retention window (`{{retention_hours}}` hours), spread over
-- the accounts, for the reaper to delete while `new` runs: what a reaper that stopped for a while
-- leaves behind.
INSERT INTO idempotency_keys (id, account_id, idempotency_key, fingerprint, request_method,
                              request_path, request_id, operation, request_params, recovery_point,
                              attempts, last_run_at, next_attempt_at, response_status,
                              response_headers, response_body, completed_at, created_at)
OVERRIDING SYSTEM VALUE
SELECT 3000000000000 + j, a.id, uuid_in(md5('old' || j)::cstring)::text,
       sha256(('oldfp' || j)::bytea), 'POST', '/v1/payments', 'req_' || substr(md5('oreq' || j), 1, 24),
       'payments.create', k.request_params, 'finished', 1, t, t, 201, k.response_headers,
       k.response_body, t, t
  FROM generate_series(1, {{count}}) j
  JOIN LATERAL (SELECT now() - ({{retention_hours}} + 2) * interval '1 hour'
                       - (j % 3600) * interval '1 second' AS t) tt ON true
  JOIN LATERAL (SELECT id FROM accounts ORDER BY id OFFSET j % 100 LIMIT 1) a ON true
  CROSS JOIN (SELECT request_params, response_headers, response_body FROM idempotency_keys
               WHERE completed_at IS NOT NULL ORDER BY id DESC LIMIT 1) k;
