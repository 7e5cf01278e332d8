-- Webhook events received from the card processor (`POST /webhooks/processor`): one row per event
-- id, the idempotent consumer's record. The row is written in the same transaction as the event's
-- effect (waking the key that creates the payment, or recording the outcome of a payment that
-- waited on its customer), so a redelivery finds it and changes nothing, and an effect that
-- rolled back leaves no row to stop the next delivery.
--
-- A row is evidence, never a second truth: a payment whose key is still at work changes only in
-- the operation's own fenced phase, which adopts the object recorded against its downstream key
-- instead of calling again.

CREATE TABLE processor_events (
    -- The processor's event id (`evt_…`): the dedupe key.
    id                   text PRIMARY KEY CHECK (id LIKE 'evt\_%' AND length(id) <= 255),
    -- `charge.succeeded`, `charge.failed`, `charge.captured`, `charge.refunded`, or
    -- `payment_intent.` `succeeded`, `payment_failed`, `amount_capturable_updated`,
    -- `requires_action`, `canceled`.
    type                 text NOT NULL,
    -- The charge (`ch_…`) or the PaymentIntent (`pi_…`) the event is about.
    object_id            text NOT NULL,
    -- The payment `metadata[payment_id]` names, when it is one of ours; NULL for an object we do
    -- not know (made elsewhere, say in the processor's dashboard): recorded, and nothing else.
    payment_id           text REFERENCES payments (id),
    -- `request.idempotency_key`: the downstream key of the call that made the change (NULL for a
    -- change no request of ours made).
    downstream_key       text,
    -- `data.object`: the charge or the PaymentIntent right after the change.
    object               jsonb NOT NULL,
    -- The event's `created`: unix seconds, by the processor's clock.
    created              bigint NOT NULL,
    received_at          timestamptz NOT NULL DEFAULT now()
);

-- The create-payment operation looks for the PaymentIntent its downstream key made.
CREATE INDEX processor_events_downstream_key_idx ON processor_events (downstream_key)
    WHERE downstream_key IS NOT NULL;

-- The phase that records a payment's outcome looks for a success the processor reported for the
-- payment under another charge or PaymentIntent (`processor_events::other_succeeded_charge`,
-- `paid_under_another_key`), holding the payment's row: by index, not by a scan of every event.
CREATE INDEX processor_events_payment_succeeded_idx ON processor_events (payment_id)
    WHERE type IN ('charge.succeeded', 'payment_intent.succeeded',
                   'payment_intent.amount_capturable_updated');

-- Retention deletes the events received longer ago than `retention.processor_events_days`, oldest
-- first (crates/domain/src/processor_events/retention.rs). The table has no column that grows with
-- time but this one, and its id is the processor's: this index is what keeps a batch from reading
-- the whole table (a timestamp, about 20 bytes an event beside an object of a few kilobytes).
CREATE INDEX processor_events_received_idx ON processor_events (received_at);
