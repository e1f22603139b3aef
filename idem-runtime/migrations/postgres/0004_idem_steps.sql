-- The step journal (`idem_runtime::Journal`): each call to another system a handler makes
-- through its journal, by operation and position, with its outcome once known. Written on
-- its own (outside the business transaction) before and after each call; deleted with
-- its record's TTL by the purge.

CREATE TABLE IF NOT EXISTS idem_steps (
    operation_id TEXT   NOT NULL,  -- the record's operation id
    idx          BIGINT NOT NULL CHECK (idx >= 0),  -- the step's position, from 0
    name         TEXT   NOT NULL,  -- the step's name, as the handler gave it
    state        TEXT   NOT NULL CHECK (state IN ('pending', 'done', 'failed')),
    value        TEXT,             -- JSON: the value (done) or the error (failed)
    calls        BIGINT NOT NULL CHECK (calls >= 1),  -- how many times it was sent
    expires_at   BIGINT NOT NULL,  -- unix milliseconds: the record's expiry when written
    CONSTRAINT idem_steps_pkey PRIMARY KEY (operation_id, idx),
    CHECK ((state = 'pending') = (value IS NULL))
);

CREATE INDEX IF NOT EXISTS idem_steps_expires_at ON idem_steps (expires_at);
