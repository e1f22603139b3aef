-- The client budget's index, made partial (`WHERE stored_bytes >= 0`, true of every
-- record), in place of `idem_records_client_budget` (migration 3). Only the budget's
-- count states that predicate, so only it can read this index: a key's lookup, whose
-- generic plan a connection may make while the table is empty (before its first
-- ANALYZE), then always reads the primary key, never every live record of the key's
-- client through this index, as it could with the index of migration 3 (measured in
-- BENCHMARKS.md, "Written once").
--
-- `CREATE INDEX` blocks writes to `idem_records` while it reads the table: on a large
-- table, apply it at a quiet time, or create the index `CONCURRENTLY` by hand first
-- (this statement then finds it), and drop the old one the same way.

CREATE INDEX IF NOT EXISTS idem_records_client_live
    ON idem_records (client, expires_at) INCLUDE (stored_bytes) WHERE stored_bytes >= 0;

DROP INDEX IF EXISTS idem_records_client_budget;
