-- +goose NO TRANSACTION
-- CREATE INDEX CONCURRENTLY cannot run in a transaction, and does not block
-- the order transactions writing the table while it builds.

-- +goose Up

-- An endpoint's failed messages, found by destination: the relay's orphan
-- job finds the deleted endpoints that still have failed messages with a
-- skip scan of it (one probe per endpoint with failed messages), and a
-- deletion, or a person's "retry all failed" of one endpoint, reads only
-- that endpoint's. Without it each read every failed message of every
-- endpoint, and the orphan job could not find failed leftovers at all.
-- Only failed rows are in it: the write path, which inserts pending rows,
-- never adds an entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_failed_destination_idx
    ON outbox_messages (destination, id) WHERE status = 'failed';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_failed_destination_idx;
