-- name: InboxRecord :execrows
-- Records a webhook-id; 0 rows means it was recorded before (a duplicate).
-- A concurrent delivery of the same id waits here for the first transaction
-- and then finds the row, so two deliveries in flight still apply once.
INSERT INTO consumer_inbox (webhook_id, event_type)
VALUES (@webhook_id, @event_type)
ON CONFLICT (webhook_id) DO NOTHING;

-- name: LedgerAppend :exec
INSERT INTO consumer_ledger (webhook_id, customer_id, order_id, event_type, amount_cents, occurred_at)
VALUES (@webhook_id, @customer_id, @order_id, @event_type, @amount_cents, @occurred_at);

-- name: CustomerApply :exec
INSERT INTO consumer_customers AS c (customer_id, orders_placed, orders_cancelled, balance_cents)
VALUES (@customer_id, @placed, @cancelled, @amount_cents)
ON CONFLICT (customer_id) DO UPDATE
SET orders_placed    = c.orders_placed + excluded.orders_placed,
    orders_cancelled = c.orders_cancelled + excluded.orders_cancelled,
    balance_cents    = c.balance_cents + excluded.balance_cents,
    updated_at       = now();

-- name: CustomerGet :one
SELECT * FROM consumer_customers WHERE customer_id = @customer_id;

-- name: LedgerForCustomer :many
SELECT * FROM consumer_ledger WHERE customer_id = @customer_id ORDER BY id;

-- name: Totals :one
SELECT
    (SELECT count(*) FROM consumer_inbox)  AS inbox,
    (SELECT count(*) FROM consumer_ledger) AS ledger;

-- name: LedgerHasPlaced :one
-- Whether the order's order.placed was applied: an order.cancelled must come
-- after it.
SELECT EXISTS (SELECT 1 FROM consumer_ledger WHERE order_id = @order_id AND event_type = 'order.placed');

-- name: InboxPrune :execrows
-- Forgets up to @batch_size webhook-ids received before @before, oldest
-- first (on consumer_inbox_received); the caller loops. A delivery of one of
-- them after this would be applied again: the retention must outlast
-- everything the sender may send again (see PruneInbox).
DELETE FROM consumer_inbox
WHERE webhook_id IN (
    SELECT i.webhook_id FROM consumer_inbox i
    WHERE i.received_at < @before
    ORDER BY i.received_at
    LIMIT @batch_size
);
