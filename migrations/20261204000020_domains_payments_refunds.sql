-- The one-column rules of payments and refunds as domains (20261204000000_domains_idempotency_keys.sql
-- says why and how). Retyping `payments.id` locks the tables whose foreign keys refer to it
-- (refunds, receipts, processor_events), so refunds are retyped in the same transaction, and the
-- locks are taken first, in one order, before any change: the migration waits for them (5 s at
-- most each) holding nothing but the ones before.
SET LOCAL lock_timeout = '5s';
LOCK TABLE payments, refunds, receipts, processor_events IN ACCESS EXCLUSIVE MODE;

CREATE DOMAIN payment_id AS text;
CREATE DOMAIN refund_id AS text;
CREATE DOMAIN amount AS bigint;
CREATE DOMAIN minor_units AS bigint;
CREATE DOMAIN currency AS text;
CREATE DOMAIN payment_status AS text;
CREATE DOMAIN capture_method AS text;
CREATE DOMAIN refund_status AS text;
CREATE DOMAIN refund_reason AS text;

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
    -- The two checks of two columns, without the `>= 0` that `minor_units` now says.
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

ALTER DOMAIN payment_id ADD CONSTRAINT payment_id_prefix CHECK (VALUE LIKE 'pay\_%') NOT VALID;
ALTER DOMAIN refund_id ADD CONSTRAINT refund_id_prefix CHECK (VALUE LIKE 're\_%') NOT VALID;
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
