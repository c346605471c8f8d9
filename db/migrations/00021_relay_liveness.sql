-- +goose Up

-- What an operator needs to tell a live relay from a row a killed one left
-- behind, and a relay that runs from one that works: each relay's own relay
-- timeout (how long its heartbeat may be silent before it counts as dead)
-- and when it last claimed a message (written with its heartbeat, so a
-- claim costs no extra write).
ALTER TABLE outbox_relays
    ADD COLUMN timeout_seconds float8 NOT NULL DEFAULT 5 CHECK (timeout_seconds > 0),
    ADD COLUMN last_claim_at   timestamptz;

-- +goose Down
ALTER TABLE outbox_relays
    DROP COLUMN timeout_seconds,
    DROP COLUMN last_claim_at;
