-- An event's id as the domain `event_id` (20261204000000_domains_idempotency_keys.sql says why and
-- how). Retyping the key column locks `webhook_attempts` too, whose foreign key refers to it.
SET LOCAL lock_timeout = '5s';

CREATE DOMAIN event_id AS text;

ALTER TABLE events
    DROP CONSTRAINT events_id_check,
    ALTER COLUMN id TYPE event_id;

ALTER DOMAIN event_id ADD CONSTRAINT event_id_prefix CHECK (VALUE LIKE 'evt\_%') NOT VALID;
