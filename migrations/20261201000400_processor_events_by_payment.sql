-- The phase that records a payment's outcome looks for a success the processor reported for the
-- payment under another charge (`processor_events::other_succeeded_charge`,
-- `paid_under_another_key`), holding the payment's row: by index, not by a scan of every event.
CREATE INDEX processor_events_payment_succeeded_idx ON processor_events (payment_id)
    WHERE type = 'charge.succeeded';
