-- +goose Up

-- Secret rotation without downtime: after a rotation the relay signs with
-- both the new and the previous secret (Standard Webhooks allows several
-- signatures in one header) until the overlap ends, so a receiver can move
-- to the new secret at its own pace.
ALTER TABLE webhook_endpoints
    ADD COLUMN previous_secret            text,
    ADD COLUMN previous_secret_expires_at timestamptz;

-- +goose Down
ALTER TABLE webhook_endpoints
    DROP COLUMN previous_secret,
    DROP COLUMN previous_secret_expires_at;
