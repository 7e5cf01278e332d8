-- When news last arrived that lets an unfinished key finish (a processor webhook about its
-- charge; crates/idem/src/store/lease.rs, `wake`), on the clock at the wake's write. A wake moves
-- a free key's next attempt to now; a key held at the time keeps its holder, and the holder's
-- release then schedules the next attempt now rather than after its back-off when the key was
-- woken since its last lease or phase began (`woken_at > last_run_at`), so news that arrived
-- while the holder's processor call failed is not lost behind a back-off of up to minutes.
--
-- Nullable, no default: adding it rewrites nothing, and the table's exclusive lock is held for an
-- instant (or the migration fails after 5 s, to be run again, rather than queue every claim behind
-- a long transaction). A release that does not know the column ignores it, as before.
SET LOCAL lock_timeout = '5s';
ALTER TABLE idempotency_keys ADD COLUMN woken_at timestamptz;
