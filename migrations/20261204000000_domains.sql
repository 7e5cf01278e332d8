-- The one-column rules of the tables every money-moving request writes (payments, refunds, events,
-- idempotency_keys) become domains: types of the database, named as the Rust types they mirror
-- (`PaymentId`, `Amount`, `Currency`, `PaymentStatus`, `IdempotencyKey`, `Fingerprint`, ...).
--
-- Why: PostgreSQL 15 reads a table's CHECK constraints back from the catalog and plans them again
-- for every statement that writes the table (`ExecRelCheck` turns each stored expression from
-- text into a tree, then plans it), and evaluates every one of them on any UPDATE. That was about
-- a third of the instructions of the backend that served a new payment (callgrind, BENCHMARKS.md
-- "Session 15"). A domain's constraints are planned once per session (the type cache) and checked
-- only where a value of the type is written. The rules are the same; only where they live moves.
-- The checks that tie two columns (a payment's captured and refunded amounts; a key's lease and its
-- stored answer) stay on their tables.
--
-- How, without rewriting a table or scanning it under an exclusive lock:
-- 1. the domains are created bare, so changing a column to one changes no stored byte (no
--    rewrite, and the indexes on the column are kept as they are);
-- 2. the checks of two columns that name a retyped column (a payment's captured and refunded
--    amounts, `idempotency_keys_final_whole`'s `response_status`) would be re-created and
--    checked against every row under this migration's exclusive lock: they are dropped and added
--    again `NOT VALID` (the payment's two without the `>= 0` that `minor_units` now says), and
--    the next migration validates them, which lets writes go on meanwhile;
-- 3. the rules are added to the domains `NOT VALID`: every value written from now on is checked;
--    the rows already stored were checked by the table constraints this drops, and validating a
--    domain would hold a lock that stops writes while it reads every row of the four tables.
SET LOCAL lock_timeout = '5s';

CREATE DOMAIN payment_id AS text;
CREATE DOMAIN refund_id AS text;
CREATE DOMAIN event_id AS text;
CREATE DOMAIN amount AS bigint;
CREATE DOMAIN minor_units AS bigint;
CREATE DOMAIN currency AS text;
CREATE DOMAIN payment_status AS text;
CREATE DOMAIN capture_method AS text;
CREATE DOMAIN refund_status AS text;
CREATE DOMAIN refund_reason AS text;
CREATE DOMAIN idempotency_key AS text;
CREATE DOMAIN fingerprint AS bytea;
CREATE DOMAIN http_status AS smallint;
CREATE DOMAIN attempt_count AS integer;

ALTER TABLE payments
    DROP CONSTRAINT payments_id_check,
    DROP CONSTRAINT payments_amount_check,
    DROP CONSTRAINT payments_currency_check,
    DROP CONSTRAINT payments_status_check,
    DROP CONSTRAINT payments_capture_method_check,
    DROP CONSTRAINT payments_check,
    DROP CONSTRAINT payments_check1,
    ALTER COLUMN id TYPE payment_id,
    ALTER COLUMN amount TYPE amount,
    ALTER COLUMN currency TYPE currency,
    ALTER COLUMN status TYPE payment_status,
    ALTER COLUMN capture_method TYPE capture_method,
    ALTER COLUMN amount_captured TYPE minor_units,
    ALTER COLUMN amount_refunded TYPE minor_units,
    ADD CONSTRAINT payments_check CHECK (amount_captured <= amount) NOT VALID,
    -- Refunded, or reserved by a refund in flight: never more than was captured.
    ADD CONSTRAINT payments_check1 CHECK (amount_refunded <= amount_captured) NOT VALID;

ALTER TABLE refunds
    DROP CONSTRAINT refunds_id_check,
    DROP CONSTRAINT refunds_amount_check,
    DROP CONSTRAINT refunds_status_check,
    DROP CONSTRAINT refunds_reason_check,
    ALTER COLUMN id TYPE refund_id,
    ALTER COLUMN amount TYPE amount,
    ALTER COLUMN status TYPE refund_status,
    ALTER COLUMN reason TYPE refund_reason;

ALTER TABLE events
    DROP CONSTRAINT events_id_check,
    ALTER COLUMN id TYPE event_id;

ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_idempotency_key_check,
    DROP CONSTRAINT idempotency_keys_fingerprint_check,
    DROP CONSTRAINT idempotency_keys_response_status_check,
    DROP CONSTRAINT idempotency_keys_attempts_check,
    DROP CONSTRAINT idempotency_keys_final_whole,
    ALTER COLUMN idempotency_key TYPE idempotency_key,
    ALTER COLUMN fingerprint TYPE fingerprint,
    ALTER COLUMN response_status TYPE http_status,
    ALTER COLUMN attempts TYPE attempt_count,
    -- The stored answer is all or nothing, and a key with one is finished and held by no one.
    ADD CONSTRAINT idempotency_keys_final_whole CHECK (
        (completed_at IS NULL AND response_status IS NULL AND response_body IS NULL)
        OR (completed_at IS NOT NULL AND response_status IS NOT NULL AND response_body IS NOT NULL
            AND owner_token IS NULL AND recovery_point = 'finished')
    ) NOT VALID;

ALTER DOMAIN payment_id ADD CONSTRAINT payment_id_prefix CHECK (VALUE LIKE 'pay\_%') NOT VALID;
ALTER DOMAIN refund_id ADD CONSTRAINT refund_id_prefix CHECK (VALUE LIKE 're\_%') NOT VALID;
ALTER DOMAIN event_id ADD CONSTRAINT event_id_prefix CHECK (VALUE LIKE 'evt\_%') NOT VALID;
-- `Amount` (crates/domain/src/money.rs): 1 to 99,999,999 minor units. A refund's amount was only
-- checked positive; it was never more than its payment's.
ALTER DOMAIN amount ADD CONSTRAINT amount_range CHECK (VALUE BETWEEN 1 AND 99999999) NOT VALID;
-- A captured or refunded amount: none or more.
ALTER DOMAIN minor_units ADD CONSTRAINT minor_units_not_negative CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN currency ADD CONSTRAINT currency_code CHECK (VALUE ~ '^[a-z]{3}$') NOT VALID;
ALTER DOMAIN payment_status ADD CONSTRAINT payment_status_known CHECK (VALUE IN
    ('processing', 'requires_capture', 'succeeded', 'failed', 'canceled')) NOT VALID;
ALTER DOMAIN capture_method ADD CONSTRAINT capture_method_known CHECK (VALUE IN
    ('automatic', 'manual')) NOT VALID;
ALTER DOMAIN refund_status ADD CONSTRAINT refund_status_known CHECK (VALUE IN
    ('pending', 'succeeded', 'failed')) NOT VALID;
ALTER DOMAIN refund_reason ADD CONSTRAINT refund_reason_known CHECK (VALUE IN
    ('duplicate', 'fraudulent', 'requested_by_customer')) NOT VALID;
ALTER DOMAIN idempotency_key ADD CONSTRAINT idempotency_key_length
    CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
-- SHA-256 of the request (crates/idem/src/fingerprint.rs).
ALTER DOMAIN fingerprint ADD CONSTRAINT fingerprint_sha256 CHECK (length(VALUE) = 32) NOT VALID;
ALTER DOMAIN http_status ADD CONSTRAINT http_status_range CHECK (VALUE BETWEEN 100 AND 599) NOT VALID;
ALTER DOMAIN attempt_count ADD CONSTRAINT attempt_count_not_negative CHECK (VALUE >= 0) NOT VALID;
