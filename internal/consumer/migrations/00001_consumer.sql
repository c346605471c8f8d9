-- +goose Up

-- The inbox: one row per webhook-id ever applied. Its primary key is what
-- makes "exactly once" true: the row is inserted in the same transaction as
-- the event's effect, so a redelivery finds it and the effect is not repeated,
-- and a transaction that failed left neither.
CREATE TABLE consumer_inbox (
    webhook_id  text        PRIMARY KEY,
    event_type  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);

-- The effect: a per-customer ledger of order events, as a downstream
-- service (billing, loyalty, analytics) would keep one.
CREATE TABLE consumer_ledger (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id  text        NOT NULL REFERENCES consumer_inbox (webhook_id),
    customer_id text        NOT NULL,
    order_id    uuid        NOT NULL,
    event_type  text        NOT NULL,
    -- Signed: an order.cancelled entry reverses its order.placed entry.
    amount_cents bigint     NOT NULL,
    occurred_at timestamptz NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consumer_ledger_customer ON consumer_ledger (customer_id, id);
CREATE INDEX consumer_ledger_order ON consumer_ledger (order_id);

-- A running balance per customer: an increment, the kind of effect a
-- redelivery would silently double without the inbox.
CREATE TABLE consumer_customers (
    customer_id      text        PRIMARY KEY,
    orders_placed    bigint      NOT NULL DEFAULT 0,
    orders_cancelled bigint      NOT NULL DEFAULT 0,
    balance_cents    bigint      NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE consumer_customers;
DROP TABLE consumer_ledger;
DROP TABLE consumer_inbox;
