-- +goose Up

-- Attempts a message made before a person last requeued it. A requeue gives
-- the message a fresh attempt budget (attempts = 0) but its history goes on:
-- outbox_attempts numbers each attempt attempts_before + attempts, so the
-- attempts after a retry are recorded after the earlier ones instead of
-- colliding with them (and being dropped by ON CONFLICT). A constant default
-- rewrites nothing.
ALTER TABLE outbox_messages
    ADD COLUMN attempts_before integer NOT NULL DEFAULT 0 CHECK (attempts_before >= 0);

-- +goose Down
ALTER TABLE outbox_messages DROP COLUMN attempts_before;
