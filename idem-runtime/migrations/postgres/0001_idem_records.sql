-- idem's records in PostgreSQL: one row per idempotency key.
--
-- Applied by `PostgresStore::connect` and `PostgresStore::from_pool` (under an advisory
-- lock, recorded in `idem_schema_migrations`). Teams that run their own migrations apply
-- this file themselves and open the store with `PostgresStore::without_migrations`.
-- Tables are created in the connection's `search_path` (by default `public`).

CREATE TABLE IF NOT EXISTS idem_records (
    operation    TEXT   NOT NULL,  -- the contract's operation, such as `create_order`
    client       TEXT   NOT NULL,  -- the client's identity
    key          TEXT   NOT NULL,  -- the idempotency key as the client meant it
    operation_id TEXT   NOT NULL,  -- a UUIDv7, the same for every attempt of the operation
    fingerprint  TEXT   NOT NULL,  -- `sha256:<hex>` of the significant content
    state        TEXT   NOT NULL
                 CHECK (state IN ('processing', 'completed', 'released', 'unknown')),
    attempt      BIGINT NOT NULL CHECK (attempt >= 1),
    token        TEXT,             -- the lease's owner, while processing
    lease_until  BIGINT,           -- the lease's end, unix milliseconds, while processing
    created_at   BIGINT NOT NULL,  -- unix milliseconds
    expires_at   BIGINT NOT NULL,  -- unix milliseconds: the key is forgotten then
    status       BIGINT,           -- the stored result, once completed
    headers      TEXT,             -- JSON: [[name, value], ...]
    body         BYTEA,
    reason       TEXT,             -- why it is parked, once unknown
    transactional BOOLEAN NOT NULL DEFAULT FALSE, -- the attempt writes in the business transaction
    -- The last line of defence against races: one record per key and namespace.
    CONSTRAINT idem_records_pkey PRIMARY KEY (operation, client, key),
    CHECK ((state = 'processing') = (token IS NOT NULL AND lease_until IS NOT NULL))
);

CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);
