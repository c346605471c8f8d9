-- +goose Up

-- The statuses an order may have, under a name of its own: a migration that
-- adds one (an order.shipped event's 'shipped', say) replaces this
-- constraint by its name,
--
--   ALTER TABLE orders DROP CONSTRAINT orders_status_valid,
--       ADD CONSTRAINT orders_status_valid CHECK (status IN ('placed', 'cancelled', 'shipped'));
--
-- instead of looking up the name PostgreSQL gave the column's CHECK. A
-- rename: nothing is checked again, and the table is locked for an instant.
ALTER TABLE orders RENAME CONSTRAINT orders_status_check TO orders_status_valid;

-- +goose Down
ALTER TABLE orders RENAME CONSTRAINT orders_status_valid TO orders_status_check;
