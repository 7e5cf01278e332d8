-- Events (the outbox), webhook endpoints, and the log of every delivery attempt.
--
-- An event is written in the same transaction as the change it describes, so it exists exactly
-- when that change committed. In the same statement, one `webhook` job per matching endpoint is
-- staged in `jobs` (dedupe key `<event>:<endpoint>`), so the fan-out commits with the event too:
-- an endpoint created after an event does not receive it, as with Stripe.

CREATE TABLE events (
    seq                  bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id                   text PRIMARY KEY CHECK (id LIKE 'evt\_%'),
    account_id           text NOT NULL REFERENCES accounts (id),
    type                 text NOT NULL,
    -- `data.object`: the object as the API showed it when the change committed.
    object               jsonb NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now()
);

-- The list, newest first, and the list filtered by type.
CREATE INDEX events_account_seq_idx ON events (account_id, seq DESC);
CREATE INDEX events_account_type_seq_idx ON events (account_id, type, seq DESC);

CREATE TABLE webhook_endpoints (
    seq                  bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id                   text PRIMARY KEY CHECK (id LIKE 'we\_%'),
    account_id           text NOT NULL REFERENCES accounts (id),
    url                  text NOT NULL,
    -- Event types delivered; `{*}` is every type.
    enabled_events       text[] NOT NULL CHECK (cardinality(enabled_events) > 0),
    -- `whsec_…`: shown once, at creation; the worker signs with it.
    secret               text NOT NULL,
    status               text NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- Deleted endpoints are kept (their delivery log refers to them) but no longer listed.
    deleted_at           timestamptz
);

CREATE INDEX webhook_endpoints_account_idx ON webhook_endpoints (account_id, seq DESC)
    WHERE deleted_at IS NULL;

-- One row per attempt to deliver an event to an endpoint: the delivery log.
CREATE TABLE webhook_attempts (
    seq                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id          text NOT NULL REFERENCES webhook_endpoints (id),
    event_id             text NOT NULL REFERENCES events (id),
    attempt              integer NOT NULL,
    -- The receiver's status code; NULL when no answer came (refused, timed out).
    status_code          integer,
    error                text,
    duration_ms          bigint NOT NULL,
    -- What became of the delivery after this attempt: `delivered`, `retrying` or `dead`.
    outcome              text NOT NULL CHECK (outcome IN ('delivered', 'retrying', 'dead')),
    created_at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, seq DESC);
CREATE INDEX webhook_attempts_event_idx ON webhook_attempts (event_id);
