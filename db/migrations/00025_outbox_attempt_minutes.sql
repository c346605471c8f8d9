-- +goose Up

-- The attempts of each endpoint summed by minute, outcome and request-time
-- bucket: what the ops page's charts, delivery rate and per-endpoint success
-- rate and latency percentiles read. Read from outbox_attempts, they cost
-- every page load a pass over the last hour's and day's attempts, which
-- grows with the delivery rate (at 100 deliveries a second an endpoint's day
-- is 8.6 million rows); summed here, an endpoint's day is at most 1,440
-- minutes of a few rows each, whatever the rate.
--
-- A derived table, written in the same statement as the attempts it sums
-- (MessagesRecordOutcomes, and the releases of lost and stale claims), so
-- it agrees with the history: one upsert per recording, of a row per
-- minute, outcome and bucket, on rows no other relay writes (a destination
-- has one relay at a time). Pruning the history does not subtract from
-- it; its own rows are pruned after two days (AttemptMinutesPrune).
CREATE TABLE outbox_attempt_minutes (
    destination uuid        NOT NULL,
    minute      timestamptz NOT NULL,
    outcome     text        NOT NULL,
    -- The upper bound (exclusive), in milliseconds, of the request-time
    -- bucket of a delivered attempt (outbox_latency_bucket_ms); 0 for other
    -- outcomes, whose request times no figure uses.
    le_ms       integer     NOT NULL,
    attempts    bigint      NOT NULL,
    -- The fastest and slowest request of the row: a percentile estimated
    -- within a bucket is kept between them, so it is exact when a bucket's
    -- requests all took the same time.
    min_ms      float8      NOT NULL,
    max_ms      float8      NOT NULL,
    PRIMARY KEY (destination, minute, outcome, le_ms)
);

-- The overview's hour over every endpoint, and the prune.
CREATE INDEX outbox_attempt_minutes_minute_idx ON outbox_attempt_minutes (minute);

-- +goose StatementBegin
-- The request-time buckets' upper bounds in milliseconds, the last one
-- standing for "slower than all the others".
CREATE FUNCTION outbox_latency_bounds_ms() RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '{1,2,5,10,20,50,100,200,500,1000,2000,5000,10000,20000,30000,60000,2147483647}'::integer[] $$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The request-time bucket of a delivered attempt that took ms
-- milliseconds: the first bound above it. One expression, so PostgreSQL
-- inlines it into the statement that calls it (written as a query over
-- the bounds it was a function call per attempt, about 13 µs each).
CREATE FUNCTION outbox_latency_bucket_ms(ms float8) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (outbox_latency_bounds_ms())[width_bucket(ms, outbox_latency_bounds_ms()::float8[]) + 1] $$;
-- +goose StatementEnd

-- +goose StatementBegin
-- Counts the sums again, from the minute of since on, from the history:
-- the upgrade's backfill below, and the way back after restoring the
-- history without its sums. What pruning took from the history is lost to
-- the sums it recounts.
CREATE FUNCTION outbox_attempt_minutes_recount(since timestamptz) RETURNS void
LANGUAGE sql AS $$
DELETE FROM outbox_attempt_minutes WHERE minute >= date_trunc('minute', since);
INSERT INTO outbox_attempt_minutes (destination, minute, outcome, le_ms, attempts, min_ms, max_ms)
SELECT m.destination, date_trunc('minute', a.finished_at), a.outcome,
       CASE WHEN a.outcome = 'delivered' THEN outbox_latency_bucket_ms(x.ms) ELSE 0 END,
       count(*), min(x.ms), max(x.ms)
FROM outbox_attempts a
JOIN outbox_messages m ON m.id = a.message_id
CROSS JOIN LATERAL (SELECT COALESCE(GREATEST(EXTRACT(epoch FROM a.finished_at - a.started_at) * 1000, 0), 0)::float8 AS ms) x
WHERE a.finished_at >= date_trunc('minute', since)
GROUP BY 1, 2, 3, 4
-- A relay recording outcomes meanwhile may have its sums replaced by this
-- count, which may not hold them yet: recount while the relays are stopped.
ON CONFLICT (destination, minute, outcome, le_ms) DO UPDATE
SET attempts = excluded.attempts, min_ms = excluded.min_ms, max_ms = excluded.max_ms;
$$;
-- +goose StatementEnd

-- The minutes of the last day whose sums hold fewer attempts than the
-- history: every attempt is summed as it is written, and pruning takes
-- only from the history, so the sums hold at least what it has. Empty when
-- the module is correct (dbtest checks it after every test, so a test
-- that writes attempts itself recounts their sums, as the relay writes
-- them).
CREATE VIEW outbox_attempt_minutes_inconsistent AS
SELECT h.destination, h.minute, h.outcome, h.attempts AS in_history, COALESCE(s.attempts, 0) AS summed
FROM (SELECT m.destination, date_trunc('minute', a.finished_at) AS minute, a.outcome, count(*) AS attempts
      FROM outbox_attempts a
      JOIN outbox_messages m ON m.id = a.message_id
      WHERE a.finished_at >= date_trunc('minute', now()) - interval '1 day'
      GROUP BY 1, 2, 3) h
LEFT JOIN (SELECT destination, minute, outcome, sum(attempts) AS attempts
           FROM outbox_attempt_minutes
           GROUP BY 1, 2, 3) s USING (destination, minute, outcome)
WHERE COALESCE(s.attempts, 0) < h.attempts;

-- The last day of history, so the page's figures do not start empty after
-- the upgrade: one pass over a day of attempts on their finished_at index.
SELECT outbox_attempt_minutes_recount(now() - interval '1 day');

-- +goose Down
DROP VIEW outbox_attempt_minutes_inconsistent;
DROP FUNCTION outbox_attempt_minutes_recount(timestamptz);
DROP FUNCTION outbox_latency_bucket_ms(float8);
DROP FUNCTION outbox_latency_bounds_ms();
DROP TABLE outbox_attempt_minutes;
