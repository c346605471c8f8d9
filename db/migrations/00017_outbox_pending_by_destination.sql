-- +goose NO TRANSACTION
-- Each statement runs on its own: CREATE INDEX CONCURRENTLY cannot run in a
-- transaction, and neither blocks the order transactions writing the table.

-- +goose Up

-- Validate what the previous migration added NOT VALID: a scan, but under a
-- lock that lets writes go on.
ALTER TABLE outbox_messages VALIDATE CONSTRAINT outbox_messages_status_check;
ALTER TABLE outbox_messages VALIDATE CONSTRAINT outbox_messages_discarded_consistent;

-- The pending index leads with the destination: each deliver job claims its
-- own endpoint's due messages (an equality and a range on this index), and
-- finding which endpoints have due work is a skip scan of it, one probe per
-- endpoint with pending messages. It replaces the index on
-- (next_attempt_at, id), so the write path still maintains one pending index.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_pending_by_destination_idx
    ON outbox_messages (destination, next_attempt_at, id) WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_pending_idx;
ALTER INDEX outbox_messages_pending_by_destination_idx RENAME TO outbox_messages_pending_idx;

-- Discarded rows are counted and pruned by age, like delivered ones.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_discarded_idx
    ON outbox_messages (discarded_at) WHERE status = 'discarded';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_discarded_idx;
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_pending_by_time_idx
    ON outbox_messages (next_attempt_at, id) WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_pending_idx;
ALTER INDEX outbox_messages_pending_by_time_idx RENAME TO outbox_messages_pending_idx;
