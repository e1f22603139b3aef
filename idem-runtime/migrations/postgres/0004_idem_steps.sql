-- The step journal (`idem_runtime::Journal`): each call to another system a handler makes
-- through its journal, by operation and position, with its outcome once known; and each
-- delivery staged for after the commit (the outbox), with when it is next due. Written on
-- its own (outside the business transaction) before and after each call; deleted with
-- its record's TTL by the purge.

CREATE TABLE IF NOT EXISTS idem_steps (
    operation_id TEXT   NOT NULL,  -- the record's operation id
    idx          BIGINT NOT NULL CHECK (idx >= 0),  -- the step's position, from 0
    operation    TEXT   NOT NULL,  -- the record's key: operation, client and key
    client       TEXT   NOT NULL,
    key          TEXT   NOT NULL,
    name         TEXT   NOT NULL,  -- the step's name, as the handler gave it
    state        TEXT   NOT NULL
                 CHECK (state IN ('pending', 'done', 'failed', 'staged', 'delivered', 'given_up')),
    value        TEXT,             -- JSON: the value (done), the error (failed), the payload
    calls        BIGINT NOT NULL CHECK (calls >= 0),  -- times sent, or claimed for delivery
    next_at      BIGINT NOT NULL DEFAULT 0,  -- a staged delivery: when it is next due
    expires_at   BIGINT NOT NULL,  -- unix milliseconds: the record's expiry when written
    CONSTRAINT idem_steps_pkey PRIMARY KEY (operation_id, idx),
    CHECK ((state = 'pending') = (value IS NULL))
);

CREATE INDEX IF NOT EXISTS idem_steps_expires_at ON idem_steps (expires_at);

-- The outbox's worker reads the staged deliveries in the order they are due.
CREATE INDEX IF NOT EXISTS idem_steps_due ON idem_steps (next_at) WHERE state = 'staged';
