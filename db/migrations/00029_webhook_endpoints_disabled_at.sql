-- +goose Up

-- When an endpoint was paused, by a person or by a 410: what the API and the
-- ops page show as the state's start. updated_at moves with every change
-- (a new URL, a rotated secret), which said nothing of the pause. NULL while
-- enabled. Endpoints paused before this column take their last update, the
-- best there is.
ALTER TABLE webhook_endpoints ADD COLUMN disabled_at timestamptz;
UPDATE webhook_endpoints SET disabled_at = updated_at WHERE NOT enabled;

-- +goose Down
ALTER TABLE webhook_endpoints DROP COLUMN disabled_at;
