-- The one-column rules of the tables every money-moving request writes (idempotency_keys here;
-- events, payments and refunds in the next two migrations) become domains: types of the database,
-- named as the Rust types they mirror (`IdempotencyKey`, `Fingerprint`, `PaymentId`, `Amount`,
-- `Currency`, `PaymentStatus`, ...; docs/decisions.md §14).
--
-- Why: PostgreSQL 15 reads a table's CHECK constraints back from the catalog and plans them again
-- for every statement that writes the table (`ExecRelCheck` turns each stored expression from
-- text into a tree, then plans it), and evaluates every one of them on any UPDATE. That was 30 %
-- of the instructions of the backend that served a new payment (callgrind, BENCHMARKS.md "Session
-- 15"). A domain's constraints are planned once per session (the type cache) and checked only
-- where a value of the type is written. The rules are the same; only where they live moves. The
-- checks that tie two columns (a payment's captured and refunded amounts; a key's lease and its
-- stored answer) stay on their tables.
--
-- How, without rewriting a table or reading it under an exclusive lock:
-- 1. the domains are created bare, so changing a column to one changes no stored byte (no
--    rewrite, and the indexes on the column are kept as they are);
-- 2. a table check that names a retyped column would be re-created and checked against every row
--    under this exclusive lock: it is dropped and added again `NOT VALID`, and
--    20261204000100_domains_checks_validated.sql validates it under a lock that lets writes go on;
-- 3. the rules are added to the domains `NOT VALID`, in the same transaction as the columns'
--    new types: every value written from now on is checked; the rows already stored were checked
--    by the table constraints dropped here, and validating a domain would hold a lock that stops
--    writes while it reads every row of its tables.
-- One migration per group of tables locked together (a retyped key column locks the tables whose
-- foreign keys refer to it), each holding its exclusive locks for an instant, or failing after
-- 5 s of waiting for one, to be run again.
--
-- Statements a connection prepared before this migration and that return a retyped column fail
-- with `0A000 cached plan must not change result type` until it prepares them again: README.md,
-- "Upgrading".
SET LOCAL lock_timeout = '5s';

CREATE DOMAIN idempotency_key AS text;
CREATE DOMAIN fingerprint AS bytea;
CREATE DOMAIN http_status AS smallint;
CREATE DOMAIN attempt_count AS integer;

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

ALTER DOMAIN idempotency_key ADD CONSTRAINT idempotency_key_length
    CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
-- SHA-256 of the request (crates/idem/src/fingerprint.rs).
ALTER DOMAIN fingerprint ADD CONSTRAINT fingerprint_sha256 CHECK (length(VALUE) = 32) NOT VALID;
ALTER DOMAIN http_status ADD CONSTRAINT http_status_range CHECK (VALUE BETWEEN 100 AND 599) NOT VALID;
ALTER DOMAIN attempt_count ADD CONSTRAINT attempt_count_not_negative CHECK (VALUE >= 0) NOT VALID;
