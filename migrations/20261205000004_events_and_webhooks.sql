-- Events (the outbox), webhook endpoints, and the log of every delivery attempt.
--
-- An event is written in the same transaction as the change it describes, so it exists exactly
-- when that change committed. In the same statement, one `webhook` job per matching endpoint is
-- staged in `jobs` (dedupe key `<event>:<endpoint>`), so the fan-out commits with the event too:
-- an endpoint created after an event does not receive it, as with Stripe.

-- An event's id, a domain as the payments' ids are (why: 20261205000002_idempotency_keys.sql).
CREATE DOMAIN event_id AS text
    CONSTRAINT event_id_prefix CHECK (VALUE LIKE 'evt\_%');

CREATE TABLE events (
    seq                  bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id                   event_id PRIMARY KEY,
    account_id           text NOT NULL REFERENCES accounts (id),
    type                 text NOT NULL,
    -- `data.object`: the object as the API showed it when the change committed.
    object               jsonb NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- The transaction that wrote the event, for a feed without gaps (below).
    xid                  xid8 DEFAULT pg_current_xact_id()
);

-- The event feed, gap-free for a poller (crates/domain/src/events.rs, `list`; docs/webhooks.md).
-- `seq` is taken when the row is inserted, not when its transaction commits: a transaction that
-- took seq 10 may commit after one that took seq 11, and a poller that moved its cursor to 11 in
-- between would never see 10. So the list walks (xid, seq) and shows only events of transactions
-- older than every transaction still running: an event that commits later has an xid at or above
-- that horizon, so it lands ahead of any cursor the list ever handed out. The list reads a NULL
-- xid as 0, the oldest, and these indexes are on that same expression so that it can use them:
-- the list newest first, and the list filtered by type.
CREATE INDEX events_account_commit_idx
    ON events (account_id, (coalesce(xid, '0'::xid8)) DESC, seq DESC);
CREATE INDEX events_account_type_commit_idx
    ON events (account_id, type, (coalesce(xid, '0'::xid8)) DESC, seq DESC);

CREATE TABLE webhook_endpoints (
    seq                  bigint GENERATED ALWAYS AS IDENTITY, -- read only in the account's index below
    id                   text PRIMARY KEY CHECK (id LIKE 'we\_%'),
    account_id           text NOT NULL REFERENCES accounts (id),
    url                  text NOT NULL,
    -- Event types delivered; `{*}` is every type.
    enabled_events       text[] NOT NULL CHECK (cardinality(enabled_events) > 0),
    -- `whsec_…`, sealed (ChaCha20-Poly1305 under `webhooks.sealing_key`, the endpoint's id
    -- authenticated with it: webhooks/sealed.rs): shown once, at creation; the worker opens it
    -- to sign a delivery.
    secret               bytea NOT NULL,
    status               text NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    -- The endpoint's health (crates/domain/src/deliveries/health.rs): failed attempts in a row,
    -- since when, and a pause. Past `webhooks.pause_after_failures` failures over
    -- `webhooks.pause_after_minutes` its deliveries are deferred until `paused_until`, then one
    -- is tried (the probe): a success ends the pause, a failure pauses it again, twice as long
    -- (`pauses` so far). Failing for `webhooks.disable_after_hours`, it is disabled, with the event
    -- `webhook_endpoint.disabled`. Any 2xx, or a status set through the API, starts it afresh.
    consecutive_failures integer NOT NULL DEFAULT 0,
    failing_since        timestamptz,
    paused_until         timestamptz,
    pauses               integer NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- Deleted endpoints are kept (their delivery log refers to them) but no longer listed.
    deleted_at           timestamptz
);

CREATE INDEX webhook_endpoints_account_idx ON webhook_endpoints (account_id, seq DESC)
    WHERE deleted_at IS NULL;

-- The webhook deliveries an event fans out to: one job (kind `webhook`) for each enabled endpoint
-- of the event's account that takes its type, with the dedupe key and payload the worker reads
-- (`jobs::WebhookJob`). Every statement that records an event inserts these in the same
-- statement, so the fan-out costs no round trip of its own. One SELECT, STABLE, in SQL: the
-- planner inlines it where it is called.
CREATE FUNCTION webhook_deliveries(event_id text, for_account text, event_type text)
RETURNS TABLE (dedupe_key text, payload jsonb)
LANGUAGE sql STABLE AS $$
    SELECT event_id || ':' || w.id,
           jsonb_build_object('event_id', event_id, 'endpoint_id', w.id)
      FROM webhook_endpoints w
     WHERE w.account_id = for_account AND w.status = 'enabled' AND w.deleted_at IS NULL
       AND (event_type = ANY (w.enabled_events) OR '*' = ANY (w.enabled_events))
$$;

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
