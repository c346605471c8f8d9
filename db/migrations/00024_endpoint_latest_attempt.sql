-- +goose Up

-- Each endpoint's latest attempt, success and error, kept by the relay as it
-- records outcomes (MessagesRecordOutcomes, and the releases of lost and
-- stale claims), one row update per recording. The ops page read them from
-- outbox_attempts, joining every attempt of the last hour to its message
-- for its endpoint: at 500 deliveries a second that took 4 s of every page
-- load. Empty after the upgrade until each endpoint's next attempt.
ALTER TABLE webhook_endpoints
    ADD COLUMN last_attempt_at        timestamptz,
    ADD COLUMN last_attempt_outcome   text,
    ADD COLUMN last_success_at        timestamptz,
    ADD COLUMN last_error_at          timestamptz,
    ADD COLUMN last_error_status_code integer,
    ADD COLUMN last_error             text;

-- +goose Down
ALTER TABLE webhook_endpoints
    DROP COLUMN last_attempt_at,
    DROP COLUMN last_attempt_outcome,
    DROP COLUMN last_success_at,
    DROP COLUMN last_error_at,
    DROP COLUMN last_error_status_code,
    DROP COLUMN last_error;
