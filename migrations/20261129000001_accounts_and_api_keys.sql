-- Accounts (tenants) and their secret API keys.
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

CREATE INDEX api_keys_account_id_idx ON api_keys (account_id);
