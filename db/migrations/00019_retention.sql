-- +goose NO TRANSACTION
-- Each statement runs on its own: CREATE INDEX CONCURRENTLY cannot run in a
-- transaction, and none of these blocks the order transactions.

-- +goose Up

-- When a message gave up, so that failed messages (and, with them, their
-- attempts and the customer data of their events) are pruned after the
-- failed retention instead of being kept forever. Without a default the
-- column costs no table rewrite.
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS failed_at timestamptz;
-- Messages that failed before this migration count from their last attempt.
UPDATE outbox_messages m
SET failed_at = COALESCE((SELECT max(a.finished_at) FROM outbox_attempts a WHERE a.message_id = m.id), m.next_attempt_at)
WHERE m.status = 'failed' AND m.failed_at IS NULL;
-- The prune job walks failed rows by age, like delivered ones.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_failed_at_idx
    ON outbox_messages (failed_at) WHERE status = 'failed';

-- Idempotency keys expire: a periodic job clears the keys older than their
-- time to live, walking this index by age. It holds only the orders that
-- still have a key, so its size follows the keys of the last day, not the
-- order history.
CREATE INDEX CONCURRENTLY IF NOT EXISTS orders_idempotency_created_idx
    ON orders (created_at) WHERE idempotency_key IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS orders_idempotency_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_failed_at_idx;
ALTER TABLE outbox_messages DROP COLUMN IF EXISTS failed_at;
