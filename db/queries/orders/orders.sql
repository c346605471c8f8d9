-- name: OrderInsert :one
-- Inserts the order unless its idempotency key was used before; then it
-- returns no row (pgx.ErrNoRows) and the caller looks the earlier order up.
-- ON CONFLICT waits for a concurrent insert of the same key to settle, so two
-- racing requests never both create an order.
INSERT INTO orders (id, customer_id, status, total_cents, idempotency_key, request_hash)
VALUES (@id, @customer_id, 'placed', @total_cents, @idempotency_key, @request_hash)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *;

-- name: OrderLinesInsert :exec
-- All lines in one round trip; line_no keeps the order of the request.
INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
SELECT @order_id, l.line_no::integer, l.sku,
       (@quantities::integer[])[l.line_no],
       (@unit_prices_cents::bigint[])[l.line_no]
FROM unnest(@skus::text[]) WITH ORDINALITY AS l (sku, line_no);

-- name: OrderGet :one
SELECT * FROM orders WHERE id = @id;

-- name: OrderGetByIdempotencyKey :one
SELECT * FROM orders WHERE idempotency_key = @idempotency_key;

-- name: OrderLinesGet :many
SELECT * FROM order_lines WHERE order_id = @order_id ORDER BY line_no;

-- name: OrderCancel :one
-- Cancels a placed order. No row means it does not exist or was already
-- cancelled: only the transition emits an event.
UPDATE orders SET status = 'cancelled', cancelled_at = now()
WHERE id = @id AND status = 'placed'
RETURNING *;

-- name: OrderIdempotencyKeysExpire :execrows
-- Clears the idempotency keys of one bounded batch of orders placed more
-- than @ttl_seconds ago (their time to live), on the database's clock, which
-- wrote created_at: a worker whose own clock is off clears nothing early;
-- the caller loops. Walked by age on
-- orders_idempotency_created_idx, which holds only orders that still have a
-- key, so each batch reads what it clears. Afterwards the same key places a
-- new order. SKIP LOCKED: an order being cancelled right now is cleared by
-- the next batch or run.
UPDATE orders SET idempotency_key = NULL, request_hash = NULL
WHERE id IN (
    SELECT o.id FROM orders o
    WHERE o.idempotency_key IS NOT NULL AND o.created_at < now() - make_interval(secs => @ttl_seconds::float8)
    ORDER BY o.created_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);
