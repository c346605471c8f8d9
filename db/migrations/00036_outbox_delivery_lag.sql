-- +goose Up

-- Commit to delivery, summed by endpoint, minute and bucket: how late each
-- delivered message reached its destination, from its event's writing to
-- the receiver's 2xx or the broker's ack, its retries' waits included. The
-- ops page reads its percentiles for the last hour and day (the api has no
-- worker's metrics to read them from); the worker's metrics have the same
-- figure as a histogram (outbox_delivery_lag_seconds).
--
-- Written by the recording of outcomes (MessagesRecordOutcomes), in the
-- same statement, as outbox_attempt_minutes is; pruned after two days with
-- it (DeliveryLagMinutesPrune).
CREATE TABLE outbox_delivery_lag_minutes (
    destination uuid        NOT NULL,
    minute      timestamptz NOT NULL,
    -- The upper bound (exclusive), in milliseconds, of the bucket
    -- (outbox_lag_bucket_ms).
    le_ms       integer     NOT NULL,
    deliveries  bigint      NOT NULL,
    -- The quickest and latest delivery of the row, to keep a percentile
    -- estimated within a bucket between them.
    min_ms      float8      NOT NULL,
    max_ms      float8      NOT NULL,
    PRIMARY KEY (destination, minute, le_ms)
);

CREATE INDEX outbox_delivery_lag_minutes_minute_idx ON outbox_delivery_lag_minutes (minute);

-- +goose StatementBegin
-- The lag buckets' upper bounds in milliseconds, from a millisecond to a
-- day, the last one standing for "later than all the others".
CREATE FUNCTION outbox_lag_bounds_ms() RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '{1,2,5,10,20,50,100,200,500,1000,2000,5000,10000,30000,60000,120000,300000,600000,1800000,3600000,7200000,18000000,43200000,86400000,2147483647}'::integer[] $$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The lag bucket of a delivery ms milliseconds after its event: the first
-- bound above it, or the last one for the latest (over 24 days: a failed
-- message retried weeks later). One expression, so it is inlined where it
-- is called.
CREATE FUNCTION outbox_lag_bucket_ms(ms float8) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (outbox_lag_bounds_ms())[LEAST(width_bucket(ms, outbox_lag_bounds_ms()::float8[]) + 1,
                                            cardinality(outbox_lag_bounds_ms()))] $$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION outbox_lag_bucket_ms(float8);
DROP FUNCTION outbox_lag_bounds_ms();
DROP TABLE outbox_delivery_lag_minutes;
