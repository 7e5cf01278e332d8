-- Payments, refunds, the audit trail, and staged jobs.
--
-- Public ids are random; `seq` gives the strict creation order that lists page by (no ties, even
-- within one second). A payment keeps the id of the idempotency key that created it, without a
-- foreign key: the reaper deletes old keys, and that must never delete or orphan a payment.

CREATE TABLE payments (
    seq                  bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id                   text PRIMARY KEY CHECK (id LIKE 'pay\_%'),
    account_id           text NOT NULL REFERENCES accounts (id),
    idempotency_key_id   bigint UNIQUE,
    amount               bigint NOT NULL CHECK (amount BETWEEN 1 AND 99999999),
    currency             text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    status               text NOT NULL CHECK (status IN
                             ('processing', 'requires_capture', 'succeeded', 'failed', 'canceled')),
    capture_method       text NOT NULL CHECK (capture_method IN ('automatic', 'manual')),
    amount_captured      bigint NOT NULL DEFAULT 0 CHECK (amount_captured BETWEEN 0 AND amount),
    -- Refunded, or reserved by a refund in flight: never more than was captured.
    amount_refunded      bigint NOT NULL DEFAULT 0 CHECK (amount_refunded BETWEEN 0 AND amount_captured),
    payment_method       text NOT NULL,
    description          text,
    metadata             jsonb NOT NULL DEFAULT '{}',
    receipt_email        text,
    processor_charge_id  text UNIQUE,
    failure_code         text,
    failure_message      text,
    cancellation_reason  text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX payments_account_seq_idx ON payments (account_id, seq DESC);

CREATE TABLE refunds (
    seq                  bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id                   text PRIMARY KEY CHECK (id LIKE 're\_%'),
    account_id           text NOT NULL REFERENCES accounts (id),
    payment_id           text NOT NULL REFERENCES payments (id),
    idempotency_key_id   bigint UNIQUE,
    amount               bigint NOT NULL CHECK (amount > 0),
    currency             text NOT NULL,
    status               text NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    reason               text CHECK (reason IN ('duplicate', 'fraudulent', 'requested_by_customer')),
    metadata             jsonb NOT NULL DEFAULT '{}',
    processor_refund_id  text UNIQUE,
    failure_code         text,
    created_at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX refunds_payment_seq_idx ON refunds (payment_id, seq DESC);

-- Who did what, from which request, when: one row per phase that changed an object.
CREATE TABLE audit_events (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id           text NOT NULL,
    object_id            text NOT NULL,
    action               text NOT NULL,
    request_id           text,
    idempotency_key_id   bigint,
    detail               jsonb NOT NULL DEFAULT '{}',
    created_at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX audit_events_object_idx ON audit_events (object_id, id);
CREATE INDEX audit_events_key_idx ON audit_events (idempotency_key_id, id);

-- Work that must happen only after a commit (the receipt email), staged in the same transaction
-- as the phase that calls for it. `dedupe_key` makes staging the same job twice a no-op.
CREATE TABLE jobs (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind                 text NOT NULL,
    dedupe_key           text NOT NULL,
    payload              jsonb NOT NULL,
    run_at               timestamptz NOT NULL DEFAULT now(),
    attempts             integer NOT NULL DEFAULT 0,
    last_error           text,
    done_at              timestamptz,
    dead_at              timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, dedupe_key)
);

CREATE INDEX jobs_due_idx ON jobs (run_at) WHERE done_at IS NULL AND dead_at IS NULL;
