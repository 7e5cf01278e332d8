-- The idempotency engine's tables, types and functions (crates/idem; docs/key-table.md):
-- `idempotency_keys`, one row per (account, key) with the recovery point its operation has
-- reached, its lease, and once final, the stored response that every later request with the key
-- replays; `idempotency_attempts`, every attempt at a key after the first; the domains of the key
-- table's one-column rules; the fence record `idem_fence` and the claim's answer `idem_claimed`;
-- and the functions that move a key: `idem_advance`, `idem_finish`, `idem_commit_fence`,
-- `idem_commit` and `idem_claim`. The engine is generic: nothing here knows of payments or names a
-- table of the domain's; `idem_claim` checks the request's credential through the hook the domain
-- defines, `idem_credentials` (in the accounts' migration). All times come from the database clock.
--
-- The one-column rules of the tables every money-moving request writes (idempotency_keys here;
-- payments, refunds and events in their own files) are domains: types of the database, named as
-- the Rust types they mirror (`IdempotencyKey`, `Fingerprint`, `PaymentId`, `Amount`,
-- `Currency`, `PaymentStatus`, ...; docs/decisions.md §14). PostgreSQL 15 reads a table's CHECK
-- constraints back from the catalog and plans them again for every statement that writes the
-- table (`ExecRelCheck` turns each stored expression from text into a tree, then plans it), and
-- evaluates every one of them on any UPDATE: 30 % of the instructions of the backend that served
-- a new payment (callgrind, BENCHMARKS.md "Session 15"). A domain's constraints are planned once
-- per session (the type cache) and checked only where a value of the type is written. The checks
-- that tie two columns (a payment's captured and refunded amounts; a key's lease and its stored
-- answer) stay on their tables.

CREATE DOMAIN idempotency_key AS text
    CONSTRAINT idempotency_key_length CHECK (length(VALUE) BETWEEN 1 AND 255);
-- SHA-256 of the request (crates/idem/src/fingerprint.rs).
CREATE DOMAIN fingerprint AS bytea
    CONSTRAINT fingerprint_sha256 CHECK (length(VALUE) = 32);
CREATE DOMAIN http_status AS smallint
    CONSTRAINT http_status_range CHECK (VALUE BETWEEN 100 AND 599);
CREATE DOMAIN attempt_count AS integer
    CONSTRAINT attempt_count_not_negative CHECK (VALUE >= 0);

CREATE TABLE idempotency_keys (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The scope: keys of two accounts never meet. (No foreign key: the engine is generic, and
    -- accounts are never deleted.)
    account_id        text NOT NULL,
    idempotency_key   idempotency_key NOT NULL,
    -- SHA-256 over method, path, query, media type, version header and canonical body.
    fingerprint       fingerprint NOT NULL,
    request_method    text NOT NULL,
    request_path      text NOT NULL,
    -- The request id of the first request, kept in stored problem bodies.
    request_id        text NOT NULL,
    -- Which operation the key runs, and its input, so the completer can resume without HTTP.
    operation         text NOT NULL,
    request_params    jsonb NOT NULL,

    recovery_point    text NOT NULL DEFAULT 'started',
    -- The lease: whoever holds owner_token may commit phases; after locked_until another
    -- process may take the key over with a new token. Both NULL when released.
    owner_token       uuid,
    locked_until      timestamptz,
    -- Every lease of the key: the claim, each client retry that resumed or took it over, each
    -- completer run.
    attempts          attempt_count NOT NULL DEFAULT 1,
    last_run_at       timestamptz NOT NULL DEFAULT now(),
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    last_error        text,
    -- Set when automatic retries must stop (too many attempts, or older than the processor's
    -- own idempotency window); a person decides what happens next.
    needs_human_at    timestamptz,

    response_status   http_status,
    response_headers  jsonb,
    response_body     bytea,
    completed_at      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),

    -- The foreign call an unfinished key is about to make, frozen by the phase that moved the key
    -- to the recovery point before the call (docs/decisions.md §8a): every attempt, by any process
    -- and any release, sends exactly this request. Opaque to the engine: the operation that
    -- planned it reads it back. NULL at a recovery point that makes no call.
    planned_call      jsonb,
    -- When the operation first met an answer that cannot tell it what the planned call did (the
    -- processor refuses the key as reused, or replays a failure it kept for it) and a lookup found
    -- nothing, by the database clock. Whatever the call made was made before that answer; a lookup
    -- that finds nothing is trusted only once this is older than the longest call plus the
    -- processor's search lag (docs/decisions.md §8b). Cleared whenever a new call is planned.
    unresolved_at     timestamptz,
    -- The completer's own attempts at the key, apart from `attempts`. `worker.max_attempts`
    -- bounds the completer's runs only: a client may retry a key as often as it likes, and those
    -- retries must not spend the completer's budget (a key a client retried through an outage
    -- would otherwise be flagged for a person the first time the completer saw it, never driven).
    -- Incremented by the completer's take (crates/idem/src/store/sweep.rs, `take_due`).
    completer_attempts integer NOT NULL DEFAULT 0,
    -- When news last arrived that lets an unfinished key finish (a processor webhook about its
    -- charge; crates/idem/src/store/lease.rs, `wake`), on the clock at the wake's write. A wake
    -- moves a free key's next attempt to now; a key held at the time keeps its holder, and the
    -- holder's release then schedules the next attempt now rather than after its back-off when
    -- the key was woken since its last lease or phase began (`woken_at > last_run_at`), so news
    -- that arrived while the holder's processor call failed is not lost behind a back-off of up
    -- to minutes.
    woken_at          timestamptz,

    CONSTRAINT idempotency_keys_account_key UNIQUE (account_id, idempotency_key),
    CONSTRAINT idempotency_keys_lease_whole CHECK ((owner_token IS NULL) = (locked_until IS NULL)),
    -- The stored answer is all or nothing, and a key with one is finished and held by no one.
    CONSTRAINT idempotency_keys_final_whole CHECK (
        (completed_at IS NULL AND response_status IS NULL AND response_body IS NULL)
        OR (completed_at IS NOT NULL AND response_status IS NOT NULL AND response_body IS NOT NULL
            AND owner_token IS NULL AND recovery_point = 'finished'))
);

-- The completer's queue: unfinished keys that no person has to look at, by due time.
CREATE INDEX idempotency_keys_due_idx ON idempotency_keys (next_attempt_at)
    WHERE completed_at IS NULL AND needs_human_at IS NULL;

-- The reaper's queue: completed keys by the time of their completion. Retention counts from
-- completion, not creation: a key the completer finished late must replay its answer for the
-- whole retention window.
CREATE INDEX idempotency_keys_completed_idx ON idempotency_keys (completed_at)
    WHERE completed_at IS NOT NULL;

-- Every attempt at a key after the first: a retry that resumed a released key or took over one
-- whose holder's lease had expired, or a run of the completer. Written by the same statement that
-- takes the lease (crates/idem/src/store/), so it costs no round trip; the inspector shows them
-- on the key's timeline. The rows go with their key when the reaper deletes it.
CREATE TABLE idempotency_attempts (
    key_id          bigint NOT NULL REFERENCES idempotency_keys (id) ON DELETE CASCADE,
    attempt         integer NOT NULL,
    -- The request that made the attempt; NULL for the completer.
    request_id      text,
    -- True when the previous holder still held the lease and it had expired (a crash or a hang);
    -- false when the key had been released after a transient failure.
    took_over       boolean NOT NULL,
    -- Where the attempt started.
    recovery_point  text NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key_id, attempt)
);

-- The fence of a new key and of a one-statement phase as one typed value. The engine builds the
-- record (crates/idem/src/store/mod.rs, `FenceRecord`, whose fields follow the order of these
-- attributes), an operation's statement passes it through unopened, and it reaches the server as
-- binary fields: no JSON to build on our side, none to parse here, and the fingerprint and the
-- answer's body travel as bytes, not as hex.
--   key_id, token, expected, lease_ms, next_point: the key, the lease, the recovery point the
--     phase starts from, how long the renewed lease lasts, the point it moves to;
--   plan: the frozen foreign call at `next_point` (or NULL);
--   status, headers, body: the final answer, when the phase stores one (status NULL otherwise);
--   account_id … params: the key's own columns when it is new (account_id NULL for a stored key).
CREATE TYPE idem_fence AS (
    key_id           bigint,
    token            uuid,
    expected         text,
    lease_ms         float8,
    next_point       text,
    plan             jsonb,
    status           smallint,
    headers          jsonb,
    body             bytea,
    account_id       text,
    idempotency_key  text,
    fingerprint      bytea,
    method           text,
    path             text,
    request_id       text,
    operation        text,
    params           jsonb
);

-- What `idem_claim` answers (crates/idem/src/store/claim.rs, `Claimed`, whose fields follow these
-- attributes' order).
CREATE TYPE idem_claimed AS (
    version          uuid,
    now_us           int8,
    live             boolean,
    id               int8,
    fingerprint      bytea,
    request_method   text,
    request_path     text,
    request_id       text,
    operation        text,
    request_params   jsonb,
    owner_token      uuid,
    lease_active     boolean,
    needs_human      boolean,
    response_status  smallint,
    response_headers jsonb,
    response_body    bytea,
    completed_at_us  int8,
    reserved         int8,
    stored           boolean
);

-- The two moves of a stored key, with typed arguments: `idem_advance` (to the next recovery
-- point, with the frozen call planned there, the lease renewed) and `idem_finish` (the final
-- answer stored, the lease dropped), both fenced on the owner token and the expected recovery
-- point. Each returns the key's id, or NULL when this lease no longer holds the key at
-- `expected`: the caller decides what a lost lease means.
--
-- The last statement of a phase of several statements calls them directly with typed
-- parameters: no JSON to build on our side or to parse on the server's, and the answer's body
-- travels as bytes. The fences below call them for a stored key, so each move is written once.
--
-- A JSON `null` plan is no plan (SQL NULL in `planned_call`), as in `idem_commit`, so that
-- `before_call` finds nothing planned and the operation plans the call from its records, instead
-- of finding a `null` it cannot parse.
CREATE FUNCTION idem_advance(key_id bigint, token uuid, expected text, next_point text,
                             plan jsonb, lease_ms float8) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    moved bigint;
BEGIN
    UPDATE idempotency_keys
       SET recovery_point = next_point,
           locked_until = now() + lease_ms * interval '1 millisecond',
           last_run_at = now(), planned_call = nullif(plan, 'null'::jsonb), unresolved_at = NULL
     WHERE id = key_id AND owner_token = token AND recovery_point = expected
    RETURNING id INTO moved;
    RETURN moved;
END
$$;

CREATE FUNCTION idem_finish(key_id bigint, token uuid, expected text, status smallint,
                            headers jsonb, body bytea) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    finished bigint;
BEGIN
    UPDATE idempotency_keys
       SET recovery_point = 'finished', owner_token = NULL, locked_until = NULL,
           response_status = status, response_headers = headers, response_body = body,
           completed_at = now(), last_run_at = now(), last_error = NULL
     WHERE id = key_id AND owner_token = token AND recovery_point = expected
    RETURNING id INTO finished;
    RETURN finished;
END
$$;

-- The fence of every phase as one function (crates/idem/src/store/mod.rs, `commit`), so that a
-- phase can be a single statement: an operation's data-modifying CTE calls it beside its own
-- writes, and the statement commits all of them or nothing (docs/key-table.md, `commit`).
-- For a new key (account_id set) the row is inserted here, after the phase's writes, with the id
-- the claim reserved: a concurrent request with the same key waits on the unique index, then one
-- of the two fails with a unique violation (23505), which rolls its whole phase back. For a stored
-- key, `idem_finish` or `idem_advance`. Returns the key's id. A stored key that this lease no
-- longer holds at `expected` raises SQLSTATE IL001 ("idempotency lease lost"), which rolls back
-- the statement and its transaction.
CREATE FUNCTION idem_commit_fence(fence idem_fence) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    committed bigint;
BEGIN
    IF fence.account_id IS NOT NULL THEN
        INSERT INTO idempotency_keys
            (id, account_id, idempotency_key, fingerprint, request_method, request_path,
             request_id, operation, request_params, recovery_point, planned_call, owner_token,
             locked_until, response_status, response_headers, response_body, completed_at)
        OVERRIDING SYSTEM VALUE
        VALUES (fence.key_id, fence.account_id, fence.idempotency_key, fence.fingerprint,
                fence.method, fence.path, fence.request_id, fence.operation, fence.params,
                CASE WHEN fence.status IS NULL THEN fence.next_point ELSE 'finished' END,
                CASE WHEN fence.status IS NULL THEN fence.plan END,
                CASE WHEN fence.status IS NULL THEN fence.token END,
                CASE WHEN fence.status IS NULL
                     THEN now() + fence.lease_ms * interval '1 millisecond' END,
                fence.status, fence.headers, fence.body,
                CASE WHEN fence.status IS NOT NULL THEN now() END)
        RETURNING id INTO committed;
    ELSIF fence.status IS NOT NULL THEN
        committed := idem_finish(fence.key_id, fence.token, fence.expected, fence.status,
                                 fence.headers, fence.body);
    ELSE
        committed := idem_advance(fence.key_id, fence.token, fence.expected, fence.next_point,
                                  fence.plan, fence.lease_ms);
    END IF;
    IF committed IS NULL THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', fence.key_id
            USING ERRCODE = 'IL001';
    END IF;
    RETURN committed;
END
$$;

-- `idem_commit_fence` with the fence as one JSON value, for a caller that builds JSON:
--   key_id, token, expected, lease_ms, next: as in `idem_fence` (`next` is `next_point`);
--   plan: the frozen foreign call at `next` (or null);
--   response: {status, headers, body (hex)} when the phase stores the final answer;
--   new: {account_id, key, fingerprint (hex), method, path, request_id, operation, params} when
--     the key is new.
-- The same answers and the same SQLSTATE IL001 as `idem_commit_fence`.
CREATE FUNCTION idem_commit(fence jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    committed bigint;
    new_key   jsonb := fence -> 'new';
    response  jsonb := nullif(fence -> 'response', 'null'::jsonb);
    plan      jsonb := nullif(fence -> 'plan', 'null'::jsonb);
    lease     interval := (fence ->> 'lease_ms')::float8 * interval '1 millisecond';
BEGIN
    IF new_key IS NOT NULL AND new_key <> 'null'::jsonb THEN
        INSERT INTO idempotency_keys
            (id, account_id, idempotency_key, fingerprint, request_method, request_path,
             request_id, operation, request_params, recovery_point, planned_call, owner_token,
             locked_until, response_status, response_headers, response_body, completed_at)
        OVERRIDING SYSTEM VALUE
        VALUES ((fence ->> 'key_id')::bigint, new_key ->> 'account_id', new_key ->> 'key',
                decode(new_key ->> 'fingerprint', 'hex'), new_key ->> 'method',
                new_key ->> 'path', new_key ->> 'request_id', new_key ->> 'operation',
                new_key -> 'params',
                CASE WHEN response IS NULL THEN fence ->> 'next' ELSE 'finished' END,
                CASE WHEN response IS NULL THEN plan END,
                CASE WHEN response IS NULL THEN (fence ->> 'token')::uuid END,
                CASE WHEN response IS NULL THEN now() + lease END,
                (response ->> 'status')::smallint, response -> 'headers',
                decode(response ->> 'body', 'hex'),
                CASE WHEN response IS NOT NULL THEN now() END)
        RETURNING id INTO committed;
    ELSIF response IS NOT NULL THEN
        committed := idem_finish((fence ->> 'key_id')::bigint, (fence ->> 'token')::uuid,
                                 fence ->> 'expected', (response ->> 'status')::smallint,
                                 response -> 'headers', decode(response ->> 'body', 'hex'));
    ELSE
        committed := idem_advance((fence ->> 'key_id')::bigint, (fence ->> 'token')::uuid,
                                  fence ->> 'expected', fence ->> 'next', plan,
                                  (fence ->> 'lease_ms')::float8);
    END IF;
    IF committed IS NULL THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', fence ->> 'key_id'
            USING ERRCODE = 'IL001';
    END IF;
    RETURN committed;
END
$$;

-- A claim's read as one function, which a new key's first phase can call too, so that a new
-- payment is two statements and two transactions (issue #18): the claim rides in the first phase.
-- Why it is safe to store a key by its first phase: docs/decisions.md §1.
--
-- idem_claim(for_account, for_key, credential, fence) answers one `idem_claimed` record:
--   - with no fence (NULL): the read alone. It checks the credential (the SHA-256 digest of the
--     API key the request presents; NULL when the caller checked it) with `idem_credentials`, reads
--     nothing when it is not a live key of the account (`live` false); reads the key's row (its
--     input only while it is unfinished: a replay never needs it); and for a key it does not find
--     reserves an id from the table's sequence (`reserved`), which the first phase stores it under.
--     With the credentials' version read in the same snapshot, and the database clock.
--   - with the fence of a new key (its account_id set): the same read, and then, when the
--     credential is live and the key absent, the key stored by `idem_commit_fence` under the
--     fence's id, or a new one from the sequence when the fence has none (`stored` true, `id` the
--     key's id). A request with the same key that stores it meanwhile makes the insert wait on the
--     unique index and then fail with a unique violation (23505), which rolls back the caller's
--     whole statement. When the key is there, nothing is written and the read answers as without
--     a fence: the caller's writes, which it makes only `WHERE (claimed).stored`, are not made.
--   - with the fence of a stored key (no account_id): that key's fenced move (idem_commit_fence,
--     SQLSTATE IL001 when the lease is lost), `stored` true; nothing is read. An operation's first
--     phase then runs for a key that was stored before it.
CREATE FUNCTION idem_claim(for_account text, for_key text, credential bytea, fence idem_fence)
RETURNS idem_claimed
LANGUAGE plpgsql AS $$
DECLARE
    claimed idem_claimed;
BEGIN
    IF fence.account_id IS NULL AND fence.key_id IS NOT NULL THEN
        claimed.id := idem_commit_fence(fence);
        claimed.live := true;
        claimed.stored := true;
        RETURN claimed;
    END IF;
    SELECT c.version, (extract(epoch FROM now()) * 1000000)::int8, c.live,
           k.id, k.fingerprint, k.request_method, k.request_path, k.request_id, k.operation,
           CASE WHEN k.response_status IS NULL THEN k.request_params END,
           k.owner_token, coalesce(k.locked_until > now(), false), k.needs_human_at IS NOT NULL,
           k.response_status, k.response_headers, k.response_body,
           (extract(epoch FROM k.completed_at) * 1000000)::int8, NULL, false
      INTO claimed
      FROM idem_credentials(for_account, credential) c
      LEFT JOIN idempotency_keys k
             ON c.live AND k.account_id = for_account AND k.idempotency_key = for_key;
    IF claimed.live AND claimed.id IS NULL THEN
        IF fence.account_id IS NULL THEN
            claimed.reserved := nextval('idempotency_keys_id_seq');
        ELSIF fence.account_id <> for_account OR fence.idempotency_key IS DISTINCT FROM for_key THEN
            RAISE EXCEPTION 'a new key''s fence for another key than the one read';
        ELSE
            fence.key_id := coalesce(fence.key_id, nextval('idempotency_keys_id_seq'));
            claimed.id := idem_commit_fence(fence);
            claimed.stored := true;
        END IF;
    END IF;
    RETURN claimed;
END
$$;
