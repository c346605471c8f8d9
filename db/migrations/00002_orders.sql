-- +goose Up
CREATE TABLE orders (
    id               uuid        PRIMARY KEY,
    customer_id      text        NOT NULL CHECK (customer_id <> ''),
    status           text        NOT NULL CHECK (status IN ('placed', 'cancelled')),
    total_cents      bigint      NOT NULL CHECK (total_cents >= 0),
    -- Client-supplied Idempotency-Key and a hash of the request it came with:
    -- the same key with another body is a client error, not a second order.
    idempotency_key  text        UNIQUE,
    request_hash     bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    cancelled_at     timestamptz,
    CONSTRAINT orders_idempotency_consistent CHECK ((idempotency_key IS NULL) = (request_hash IS NULL))
);

CREATE TABLE order_lines (
    order_id         uuid    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line_no          integer NOT NULL,
    sku              text    NOT NULL CHECK (sku <> ''),
    quantity         integer NOT NULL CHECK (quantity >= 1),
    unit_price_cents bigint  NOT NULL CHECK (unit_price_cents >= 0),
    PRIMARY KEY (order_id, line_no)
);

-- +goose Down
DROP TABLE order_lines;
DROP TABLE orders;
