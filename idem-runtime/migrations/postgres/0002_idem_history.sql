-- The history of each record's attempts and operator resolutions (`idem ops show`): a
-- JSON array of at most 32 events, written by the statement that reclaims, takes over or
-- resolves the record (a new key writes none). See `idem_runtime::store::ops`.

ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS history JSONB;
