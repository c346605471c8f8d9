-- +goose Up

-- Every delivery attempt, as the answer to "did we tell them, and when, and
-- what did they say?". Deleted with its message when the prune job removes it.
CREATE TABLE outbox_attempts (
    message_id  uuid        NOT NULL REFERENCES outbox_messages (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    -- delivered, retry, failed, gone, undeliverable, or timeout (claim timed out)
    outcome     text        NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    -- The receiver's HTTP status; NULL when no answer came.
    status_code integer,
    error       text,
    PRIMARY KEY (message_id, attempt)
);

-- +goose Down
DROP TABLE outbox_attempts;
