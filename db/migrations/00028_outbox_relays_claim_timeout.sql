-- +goose Up

-- Each relay's own claim timeout, so that a claim goes stale after the
-- timeout of the relay that made it (MessageReleaseStale), whichever relay
-- looks: relays of one database may run with different settings during a
-- rollout. NULL for a relay registered before this column: its claims go
-- stale after the looking relay's timeout, as all did before.
ALTER TABLE outbox_relays
    ADD COLUMN claim_timeout_seconds float8 CHECK (claim_timeout_seconds > 0);

-- +goose Down
ALTER TABLE outbox_relays
    DROP COLUMN claim_timeout_seconds;
