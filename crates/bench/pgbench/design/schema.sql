-- Copied unchanged below this header from shared/bench-floor/schema.sql (the steering repository's
-- design floor, issue #18) so that `make bench` does not depend on ../shared at run time.
-- Refresh by copying the file again; never edit the SQL here.
-- Minimal schema of the idempotent-payment design (shared/spec/idempotency.md), enough for
-- the pgbench floor. Not the project's migrations: the same shapes, indexes and row sizes.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    id               bigserial PRIMARY KEY,
    account_id       bigint      NOT NULL,
    idem_key         text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    method           text        NOT NULL,
    path             text        NOT NULL,
    recovery_point   text        NOT NULL DEFAULT 'started',
    owner_token      uuid,
    locked_until     timestamptz,
    attempts         int         NOT NULL DEFAULT 1,
    last_run_at      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at  timestamptz,
    response_status  int,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_unfinished_idx
    ON idempotency_keys (next_attempt_at) WHERE recovery_point <> 'finished';
CREATE INDEX IF NOT EXISTS idempotency_keys_created_idx ON idempotency_keys (created_at);

CREATE TABLE IF NOT EXISTS payments (
    id                  text        PRIMARY KEY,
    account_id          bigint      NOT NULL,
    amount              bigint      NOT NULL,
    currency            text        NOT NULL,
    payment_method      text        NOT NULL,
    capture_method      text        NOT NULL DEFAULT 'automatic',
    status              text        NOT NULL,
    amount_captured     bigint      NOT NULL DEFAULT 0,
    amount_refunded     bigint      NOT NULL DEFAULT 0,
    description         text,
    metadata            jsonb       NOT NULL DEFAULT '{}',
    receipt_email       text,
    processor_charge_id text,
    failure_code        text,
    failure_message     text,
    created             timestamptz NOT NULL DEFAULT now(),
    version             int         NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS payments_account_created_idx ON payments (account_id, created DESC, id);

CREATE TABLE IF NOT EXISTS jobs (
    id          bigserial   PRIMARY KEY,
    kind        text        NOT NULL,
    payload     jsonb       NOT NULL,
    run_at      timestamptz NOT NULL DEFAULT now(),
    attempts    int         NOT NULL DEFAULT 0,
    locked_until timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS jobs_run_at_idx ON jobs (run_at);
