-- +goose Up

-- The ops page reads the last hour of attempts (deliveries per minute by
-- outcome, delivery rate, each endpoint's last success and last error). Without
-- this index each of those reads scans every attempt kept for the retention
-- period; with it, the cost is that of the window read.
CREATE INDEX outbox_attempts_finished_idx ON outbox_attempts (finished_at);

-- +goose Down
DROP INDEX outbox_attempts_finished_idx;
