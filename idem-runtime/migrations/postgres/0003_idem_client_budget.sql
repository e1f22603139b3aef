-- The client budget (`idem_runtime::store::budget`): each record's stored result size,
-- and an index on a client's live records in the order they expire, which the budget's
-- count at registration reads (an index-only scan where the visibility map allows).
--
-- Records stored before this migration count 0 bytes until they expire. `CREATE INDEX`
-- blocks writes to `idem_records` while it builds: on a large table, apply it at a quiet
-- time, or create the index `CONCURRENTLY` by hand first (this statement then finds it).

ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS stored_bytes BIGINT NOT NULL DEFAULT 0;

CREATE INDEX IF NOT EXISTS idem_records_client_budget
    ON idem_records (client, expires_at) INCLUDE (stored_bytes);
