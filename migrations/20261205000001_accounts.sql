-- Accounts (tenants), their secret API keys, their verified email addresses, and the credentials'
-- version, which every change to the keys that could end a key's life replaces (a trigger on
-- api_keys).
--
-- A key is shown once when created; only its SHA-256 digest is stored, so a leaked database
-- cannot be used to call the API.

CREATE TABLE accounts (
    id          text PRIMARY KEY CHECK (id LIKE 'acct\_%'),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          text PRIMARY KEY CHECK (id LIKE 'key\_%'),
    account_id  text NOT NULL REFERENCES accounts (id),
    -- SHA-256 of the full secret key; the lookup on every authenticated request.
    key_hash    bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    -- The last four characters, so that an operator can tell keys apart without the secret.
    last4       text NOT NULL CHECK (length(last4) = 4),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- No index on account_id: keys are found by their hash (authentication) or their id (revocation),
-- and accounts are never deleted (docs/reference/indexes.md).

-- The account's own email addresses, each verified by the operator, who vouches for it
-- (`payments-api accounts verify-email`; the server sends no message to ask, which would itself be
-- mail to an address no one verified). Every key is a test-mode key (`sk_test_`), and a test-mode
-- receipt goes out only to one of these: to any other address it is recorded, not sent
-- (crates/domain/src/receipts/claim.rs). Lower case; a receipt's address is lower-cased to compare.
CREATE TABLE verified_emails (
    account_id  text NOT NULL REFERENCES accounts (id),
    email       text NOT NULL CHECK (email = lower(email) AND length(email) BETWEEN 3 AND 254),
    verified_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, email)
);

-- The credentials' version: a number that every change to `api_keys` which could end a key's life
-- (a revocation, a deletion, a key moved to another account or re-hashed) replaces, in the same
-- transaction. The engine keeps the answers of finished keys in memory and answers a replay from
-- them only after a read of this number that began after the request arrived shows it unchanged
-- since the request's credential was last found live (crates/idem/src/engine/replay_cache.rs): a
-- key revoked before the request arrived is refused, exactly as by a read of `api_keys`.
--
-- A random UUID rather than a count, so that no two changes share a version even across a
-- failover to a standby that lost the last few commits (a counter would hand out again the
-- numbers those commits had used); from gen_random_uuid, whose source no session can seed.
CREATE TABLE credentials_version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version  uuid    NOT NULL DEFAULT gen_random_uuid()
);
INSERT INTO credentials_version DEFAULT VALUES;

CREATE FUNCTION credentials_version_advance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE credentials_version SET version = gen_random_uuid();
    RETURN NULL;
END
$$;

-- Per statement, not per row: a revocation of many keys changes the version once. Creating a key
-- does not change it (no answer kept in memory depends on a key that did not exist).
CREATE TRIGGER api_keys_credentials_version
    AFTER UPDATE OF account_id, key_hash, revoked_at OR DELETE OR TRUNCATE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION credentials_version_advance();
-- Also in sessions that replay changes (`session_replication_role = replica`: logical
-- replication). A restore that disables every trigger while it loads re-enables this one as an
-- ordinary trigger: run this statement again after one (docs/appendix-performance.md).
ALTER TABLE api_keys ENABLE ALWAYS TRIGGER api_keys_credentials_version;

-- What the idempotency engine checks a request's API key against, in the claim's own statement
-- (`idem_claim`), so that a request whose account is known costs no authentication of its own:
-- the credentials' version, and whether `credential` (a SHA-256 digest; NULL when the caller
-- checked the key itself) is a live key of the account. The engine names no table of ours: this
-- is the hook it calls. One SELECT, STABLE, in SQL: the planner inlines it into the engine's
-- statement, as if its text were written there.
CREATE FUNCTION idem_credentials(for_account text, credential bytea)
RETURNS TABLE (version uuid, live boolean)
LANGUAGE sql STABLE AS $$
    SELECT v.version, p.live IS NOT NULL
      FROM credentials_version v
      -- A relation rather than an expression, so that a caller that reads `live` twice (in its
      -- select list and a join) looks the key up once.
      LEFT JOIN (SELECT true AS live
                  WHERE credential IS NULL
                     OR EXISTS (SELECT 1 FROM api_keys a
                                 WHERE a.key_hash = credential AND a.account_id = for_account
                                   AND a.revoked_at IS NULL)) p ON true
$$;
