-- +goose Up

-- The dispatch walks two indexes side by side: the destinations with
-- pending messages (outbox_messages_pending_idx) and the endpoints that may
-- be served whenever they have work, the enabled ones not backing off
-- (this one). Each step jumps to the next id present in both, so a poll
-- costs at most twice the smaller of the two sets: endpoints down with a
-- backlog each, or idle healthy ones, are not visited one by one.
CREATE INDEX webhook_endpoints_servable_idx ON webhook_endpoints (id)
    WHERE enabled AND backoff_until IS NULL;

-- Endpoints backing off (or held by a Retry-After) are found by when they
-- may be served again: those whose time has come, and no others.
CREATE INDEX webhook_endpoints_backoff_idx ON webhook_endpoints (backoff_until)
    WHERE enabled AND backoff_until IS NOT NULL;

-- +goose Down
DROP INDEX webhook_endpoints_backoff_idx;
DROP INDEX webhook_endpoints_servable_idx;
