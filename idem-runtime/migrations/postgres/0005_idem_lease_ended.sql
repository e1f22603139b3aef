-- The reconciler's listing (`OperatorStore::list` with only ended leases): the lease's
-- end of each processing record, which that listing reads instead of every record. Only
-- processing records are in it (the attempts in flight and those whose lease ended), so
-- it stays small however many records the table holds, and a completed record leaves it.
--
-- `CREATE INDEX` blocks writes to `idem_records` while it reads the table: on a large
-- table, apply it at a quiet time, or create the index `CONCURRENTLY` by hand first
-- (this statement then finds it).

CREATE INDEX IF NOT EXISTS idem_records_lease_ended
    ON idem_records (lease_until) WHERE state = 'processing';
