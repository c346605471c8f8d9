-- +goose NO TRANSACTION
-- CREATE INDEX CONCURRENTLY cannot run in a transaction, and does not block
-- the order transactions while it builds.

-- +goose Up

-- "What happened to order X?": the ops page's search finds an order's events
-- by their ordering key (the orders module keys its events by order id),
-- and from them their deliveries on the primary key. Only keyed events are
-- in it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_ordering_key_idx
    ON outbox_events (ordering_key) WHERE ordering_key IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_events_ordering_key_idx;
