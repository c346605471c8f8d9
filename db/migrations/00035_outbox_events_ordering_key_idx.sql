-- +goose NO TRANSACTION
-- CREATE INDEX CONCURRENTLY cannot run in a transaction, and does not block
-- the order transactions writing the table while it builds.

-- +goose Up

-- An ordering key's events, whatever their time: what the ops page's
-- search and the message list's key filter read to show everything that
-- happened to one order (its placement, its cancellation, and any event a
-- module adds later, written days after). Without it a key's events were
-- found by reading a window of the events' primary key, which the orders
-- module bounded by its placement and cancellation, so a later event fell
-- outside it. Its cost is one entry per keyed event, in the transaction
-- that writes it (docs/design.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_ordering_key_idx
    ON outbox_events (ordering_key, id) WHERE ordering_key IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_events_ordering_key_idx;
