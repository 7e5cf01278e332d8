-- Payments and refunds with the domains of their one-column rules, the audit trail, staged jobs,
-- and receipts.
--
-- Public ids are random; `seq` gives the strict insertion order (no ties, even within one
-- second). A payment keeps the id of the idempotency key that created it, without a foreign key:
-- the reaper deletes old keys, and that must never delete or orphan a payment.
--
-- The one-column rules of payments and refunds are domains named as the Rust types, planned once
-- per session rather than by every statement that writes the table (why:
-- 20261205000002_idempotency_keys.sql). The checks that tie two columns stay on the table.

CREATE DOMAIN payment_id AS text
    CONSTRAINT payment_id_prefix CHECK (VALUE LIKE 'pay\_%');
CREATE DOMAIN refund_id AS text
    CONSTRAINT refund_id_prefix CHECK (VALUE LIKE 're\_%');
-- `Amount` (crates/domain/src/money.rs): 1 to 99,999,999 minor units. A refund's amount too: it
-- is never more than its payment's.
CREATE DOMAIN amount AS bigint
    CONSTRAINT amount_range CHECK (VALUE BETWEEN 1 AND 99999999);
-- A captured or refunded amount: none or more.
CREATE DOMAIN minor_units AS bigint
    CONSTRAINT minor_units_not_negative CHECK (VALUE >= 0);
CREATE DOMAIN currency AS text
    CONSTRAINT currency_code CHECK (VALUE ~ '^[a-z]{3}$');
CREATE DOMAIN payment_status AS text
    CONSTRAINT payment_status_known CHECK (VALUE IN
        ('processing', 'requires_action', 'requires_capture', 'succeeded', 'failed', 'canceled'));
CREATE DOMAIN capture_method AS text
    CONSTRAINT capture_method_known CHECK (VALUE IN ('automatic', 'manual'));
CREATE DOMAIN refund_status AS text
    CONSTRAINT refund_status_known CHECK (VALUE IN ('pending', 'succeeded', 'failed'));
CREATE DOMAIN refund_reason AS text
    CONSTRAINT refund_reason_known CHECK (VALUE IN
        ('duplicate', 'fraudulent', 'requested_by_customer'));

-- `seq` is the tie-breaker of the list's order (created_at, seq) and is read only through the
-- account's index below: no index of its own (it would cost 40 bytes a payment and serve no query).
CREATE TABLE payments (
    seq                  bigint GENERATED ALWAYS AS IDENTITY,
    id                   payment_id PRIMARY KEY,
    account_id           text NOT NULL REFERENCES accounts (id),
    idempotency_key_id   bigint UNIQUE,
    amount               amount NOT NULL,
    currency             currency NOT NULL,
    status               payment_status NOT NULL,
    capture_method       capture_method NOT NULL,
    amount_captured      minor_units NOT NULL DEFAULT 0,
    -- Refunded, or reserved by a refund in flight.
    amount_refunded      minor_units NOT NULL DEFAULT 0,
    payment_method       text NOT NULL,
    description          text,
    metadata             jsonb NOT NULL DEFAULT '{}',
    receipt_email        text,
    -- The processor's PaymentIntent (`pi_…`), which every later call addresses, and its latest
    -- charge (`ch_…`), which its events and the refunds name.
    processor_payment_intent_id text UNIQUE,
    processor_charge_id  text UNIQUE,
    -- Where the customer authenticates, while the payment `requires_action`.
    next_action_url      text,
    failure_code         text,
    failure_message      text,
    cancellation_reason  text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- Never more captured than the amount.
    CONSTRAINT payments_check CHECK (amount_captured <= amount),
    -- Never more refunded than was captured.
    CONSTRAINT payments_check1 CHECK (amount_refunded <= amount_captured),
    -- A payment waiting on its customer knows where to send them, and no other does.
    CONSTRAINT payments_next_action CHECK ((status = 'requires_action') = (next_action_url IS NOT NULL))
);

-- Lists are ordered by what the client sees: `created` (created_at), newest first, with `seq`
-- breaking ties. `seq` alone is insertion order, and a payment whose transaction began earlier
-- (an older `created`) can be inserted after one that began later: a list by `seq` walked newest
-- first would meet a `created` older than the next one's. These indexes let every page walk
-- (account, created_at, seq) from its cursor and stop after `limit + 1` rows.
CREATE INDEX payments_account_created_seq_idx ON payments (account_id, created_at DESC, seq DESC);

CREATE TABLE refunds (
    seq                  bigint GENERATED ALWAYS AS IDENTITY, -- as payments.seq: no index of its own
    id                   refund_id PRIMARY KEY,
    account_id           text NOT NULL REFERENCES accounts (id),
    payment_id           text NOT NULL REFERENCES payments (id),
    idempotency_key_id   bigint UNIQUE,
    amount               amount NOT NULL,
    currency             text NOT NULL,
    status               refund_status NOT NULL,
    reason               refund_reason,
    metadata             jsonb NOT NULL DEFAULT '{}',
    processor_refund_id  text UNIQUE,
    failure_code         text,
    created_at           timestamptz NOT NULL DEFAULT now()
);

-- A payment's refunds, newest first (as the payments' list above).
CREATE INDEX refunds_payment_created_seq_idx ON refunds (payment_id, created_at DESC, seq DESC);

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

-- An object's trail (the operator's query in docs/operations.md, "A payment's audit trail": a
-- capture's or a cancel's key is named by nothing but its records) and a key's (the inspector's,
-- `audit::for_key`). One column each, not (column, id): an object's or a key's records then share
-- one index entry (B-tree deduplication), which took the two from 156 and 66 bytes a payment to 91
-- and 44 (docs/scale.md); the few rows of one object are sorted by id after.
CREATE INDEX audit_events_object_idx ON audit_events (object_id);
CREATE INDEX audit_events_key_idx ON audit_events (idempotency_key_id);

-- Work that must happen only after a commit (the receipt email, a webhook delivery), staged in
-- the same transaction as the phase that calls for it. `dedupe_key` makes staging the same job
-- twice a no-op.
CREATE TABLE jobs (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind                 text NOT NULL,
    -- In byte order (collation "C"), whatever the database's: an event's deliveries
    -- (`<event>:<endpoint>`) are then one range of the unique index below, which retention reads
    -- to keep an event while any of them is pending (crates/domain/src/events.rs, `delete_expired`).
    dedupe_key           text COLLATE "C" NOT NULL,
    payload              jsonb NOT NULL,
    run_at               timestamptz NOT NULL DEFAULT now(),
    attempts             integer NOT NULL DEFAULT 0,
    last_error           text,
    done_at              timestamptz,
    dead_at              timestamptz,
    -- Until when a runner holds the job (its claim): set by a claim, cleared by `done`/`failed`.
    -- A claim also moves `run_at` to the same time, so a runner that dies leaves the job due again
    -- when it runs out; this column tells a job being run from one waiting for its retry, which
    -- is what the deliveries' caps count.
    claimed_until        timestamptz,
    -- The endpoint a `webhook` job delivers to (NULL for other kinds), read from its payload:
    -- the deliveries are claimed endpoint by endpoint (crates/domain/src/deliveries/claim.rs),
    -- and every statement that stages one keeps writing only `kind`, `dedupe_key`, `payload`.
    endpoint_id          text GENERATED ALWAYS AS
                             (CASE WHEN kind = 'webhook' THEN payload->>'endpoint_id' END) STORED,
    created_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, dedupe_key)
);

-- The jobs other than deliveries (receipts), in the order they fall due.
CREATE INDEX jobs_due_idx ON jobs (run_at)
    WHERE endpoint_id IS NULL AND done_at IS NULL AND dead_at IS NULL;
-- The deliveries waiting, per endpoint, in the order they fall due: the fair claim walks the
-- endpoints that have any (one index descent each) and takes each one's oldest due ones, so a
-- paused endpoint's backlog is never read.
CREATE INDEX jobs_endpoint_due_idx ON jobs (endpoint_id, run_at)
    WHERE endpoint_id IS NOT NULL AND done_at IS NULL AND dead_at IS NULL;
-- The deliveries being run, per endpoint: what the caps count.
CREATE INDEX jobs_endpoint_claimed_idx ON jobs (endpoint_id)
    WHERE endpoint_id IS NOT NULL AND claimed_until IS NOT NULL;

-- Receipts of payments. One per payment: the primary key is what makes a receipt job that runs
-- twice record one receipt. A receipt is first let through to be sent (`admitted_at`), or withheld
-- for good (`not_sent_reason`), with the row locked (crates/domain/src/receipts/claim.rs). A run
-- sends it only while it holds the send (`sending_until`, taken with the row locked), so two runs
-- of one receipt never send it side by side; the hold runs out, so a run that died mid-send leaves
-- the receipt to the next (which sends it again: a crash between the send and `sent_at` is the one
-- way a receipt goes out twice). `sent_at` is set once the mailer accepted it.
CREATE TABLE receipts (
    payment_id      text PRIMARY KEY REFERENCES payments (id),
    account_id      text NOT NULL,
    email           text NOT NULL,
    body            text NOT NULL,
    -- When it was let through to be sent: to an address it may go to, within its account's
    -- quota (`worker.receipts_per_account_per_hour`, which counts these). NULL until then, and
    -- for good when `not_sent_reason` says why not.
    admitted_at     timestamptz,
    -- Why it is never sent: `unverified_recipient` (test mode, and the address is not one of the
    -- account's `verified_emails`) or `quota_exceeded`. Recorded and kept, not retried.
    not_sent_reason text CHECK (not_sent_reason IN ('unverified_recipient', 'quota_exceeded')),
    -- A run is sending it until then; NULL when no run is (none yet, it failed, or it is sent).
    sending_until   timestamptz,
    -- The holds taken so far: a run gives its hold back after a failed send only if it is still
    -- the last one taken.
    send_attempts   integer NOT NULL DEFAULT 0 CHECK (send_attempts >= 0),
    sent_at         timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (not_sent_reason IS NULL OR admitted_at IS NULL),
    CHECK (admitted_at IS NOT NULL OR (sending_until IS NULL AND sent_at IS NULL)),
    CHECK (sent_at IS NULL OR sending_until IS NULL)
);

-- The quota's count: an account's receipts let through in the last hour.
CREATE INDEX receipts_admitted_idx ON receipts (account_id, admitted_at)
    WHERE admitted_at IS NOT NULL;
