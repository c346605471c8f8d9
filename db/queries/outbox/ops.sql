-- Queries of the ops page (internal/ops, through the admin package). Each reads a
-- bounded window or a partial index: none grows with the delivered history.

-- name: OpsAttemptsPerMinute :many
-- Attempts per minute and outcome since @since (the chart's hour), summed
-- from outbox_attempt_minutes on its minute index.
SELECT minute, outcome, sum(attempts)::bigint AS attempts
FROM outbox_attempt_minutes
WHERE minute >= @since::timestamptz
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: OpsCreatedPerMinute :many
-- Messages created per minute since @since. Their ids are UUIDv7 with their
-- event's time, so the primary key finds the window without an index on
-- created_at (a replay's messages carry their old event's time: they are
-- not in this window).
SELECT date_trunc('minute', created_at)::timestamptz AS minute, count(*) AS created
FROM outbox_messages
WHERE id >= outbox_uuid_at(@since::timestamptz)
GROUP BY 1
ORDER BY 1;

-- name: OpsEndpointHealth :many
-- Every endpoint with its latest attempt, success and error, kept on the
-- endpoint by the relay (reading them costs the same at any delivery
-- rate); since is the start of the last @window_seconds on the database's
-- clock, before which the caller drops them. What waits for each endpoint
-- comes from OpsBacklog.
SELECT e.id, e.url, e.event_types, e.enabled, e.disabled_reason, e.created_at,
       e.health, e.health_reason, e.health_changed_at, e.consecutive_failures, e.backoff_until, e.updated_at, e.disabled_at,
       e.last_success_at, e.last_error_at, e.last_error_status_code, e.last_error, e.last_attempt_at, e.last_attempt_outcome,
       (now() - make_interval(secs => @window_seconds::float8))::timestamptz AS since
FROM webhook_endpoints e
ORDER BY e.created_at, e.id;

-- name: OpsBacklog :many
-- Everything that waits or failed, per destination, in ONE pass over each
-- status's partial index: the counts, the ages and the due backlog that the
-- ops page, the relay status and the metrics show all come from here, so a
-- page load reads a backlog of millions (an endpoint paused for a day) once,
-- not once per panel. Messages are grouped before their endpoint is joined:
-- one join per destination, not one per message. A destination whose
-- endpoint was deleted and whose messages are not discarded yet has a row
-- with enabled NULL.
--
-- A pending message (parked ones aside) is due when its own next attempt
-- has come and its endpoint is enabled and not backing off; scheduled when
-- its retry or its endpoint's backoff lies ahead; paused when its endpoint
-- is disabled. oldest_due_seconds is how long the oldest due one has been
-- due; oldest_pending_age_seconds how long the oldest pending one (parked
-- ones included) has existed. poisoned counts the messages not settled
-- that have spent at least @poisoned_attempts attempts (half the cap: a
-- poison message on its way to failing), none when it is 0. Ages are
-- against the database's clock.
WITH m AS (
    SELECT destination,
           count(*) FILTER (WHERE status = 'pending' AND NOT parked) AS pending,
           count(*) FILTER (WHERE parked)                            AS parked,
           count(*) FILTER (WHERE status = 'claimed')                AS claimed,
           count(*) FILTER (WHERE status = 'failed')                 AS failed,
           count(*) FILTER (WHERE @poisoned_attempts::integer > 0 AND status IN ('pending', 'claimed') AND attempts >= @poisoned_attempts::integer) AS poisoned,
           count(*) FILTER (WHERE status = 'pending' AND NOT parked AND next_attempt_at <= now()) AS ready,
           -- A replayed message is due at its event's time, but waits only
           -- since the replay wrote it.
           min(GREATEST(next_attempt_at, created_at)) FILTER (WHERE status = 'pending' AND NOT parked AND next_attempt_at <= now()) AS ready_since,
           count(*) FILTER (WHERE status = 'pending' AND NOT parked AND attempts > 0 AND next_attempt_at > now()) AS backing_off,
           min(next_attempt_at) FILTER (WHERE status = 'pending' AND NOT parked AND attempts > 0 AND next_attempt_at > now())::timestamptz AS next_retry_at,
           min(created_at) FILTER (WHERE status = 'pending')         AS oldest_pending_at
    FROM (
        SELECT destination, status, parked, attempts, next_attempt_at, created_at FROM outbox_messages
        WHERE status = 'pending' AND NOT parked
        UNION ALL
        SELECT destination, status, parked, attempts, next_attempt_at, created_at FROM outbox_messages
        WHERE ordering_key IS NOT NULL AND status = 'pending' AND parked
        UNION ALL
        SELECT destination, status, parked, attempts, next_attempt_at, created_at FROM outbox_messages
        WHERE status = 'claimed'
        UNION ALL
        SELECT destination, status, parked, attempts, next_attempt_at, created_at FROM outbox_messages
        WHERE status = 'failed'
    ) w
    GROUP BY destination
)
SELECT m.destination::uuid AS destination, e.enabled,
       m.pending::bigint AS pending, m.parked::bigint AS parked, m.claimed::bigint AS claimed,
       m.failed::bigint AS failed, m.poisoned::bigint AS poisoned, m.backing_off::bigint AS backing_off, m.next_retry_at,
       (CASE WHEN e.enabled AND NOT COALESCE(e.backoff_until > now(), false) THEN m.ready ELSE 0 END)::bigint AS due,
       (CASE WHEN e.id IS NULL OR NOT e.enabled THEN 0
             WHEN e.backoff_until > now() THEN m.pending
             ELSE m.pending - m.ready END)::bigint AS scheduled,
       (CASE WHEN NOT e.enabled THEN m.pending ELSE 0 END)::bigint AS paused,
       -- Due since the later of its own time and the end of a backoff, and
       -- only when something is due: GREATEST skips a NULL ready_since, and
       -- would age an ended backoff with nothing due.
       COALESCE(CASE WHEN e.enabled AND NOT COALESCE(e.backoff_until > now(), false) AND m.ready_since IS NOT NULL
                     THEN EXTRACT(epoch FROM now() - GREATEST(m.ready_since, e.backoff_until)) END, 0)::float8
           AS oldest_due_seconds,
       COALESCE(EXTRACT(epoch FROM now() - m.oldest_pending_at), 0)::float8 AS oldest_pending_age_seconds
-- A full join filtered to m's rows is m LEFT JOIN e; written so, its
-- columns may be NULL (next_retry_at is when nothing backs off).
FROM m
FULL JOIN webhook_endpoints e ON e.id = m.destination
WHERE m.destination IS NOT NULL
ORDER BY m.destination;

-- name: OpsRetryFailedForDestination :many
-- A person's requeue of every failed message of one endpoint, as MessageRetry
-- does for one: only while the endpoint exists (a deleted endpoint's failed
-- messages are the orphan job's to discard). On
-- outbox_messages_failed_destination_idx.
UPDATE outbox_messages
SET status = 'pending', attempts_before = attempts_before + attempts, attempts = 0, next_attempt_at = now()
WHERE destination = @destination AND status = 'failed'
  AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = @destination)
RETURNING id;

-- name: OpsDeliveryRate :one
-- Deliveries in the last 5 and 60 minutes (the current minute and the 4 or
-- 59 before it), from outbox_attempt_minutes on its minute index.
SELECT COALESCE(sum(attempts) FILTER (WHERE minute >= date_trunc('minute', now()) - interval '4 minutes'), 0)::bigint AS last_5m,
       COALESCE(sum(attempts), 0)::bigint                                                                    AS last_60m
FROM outbox_attempt_minutes
WHERE minute >= date_trunc('minute', now()) - interval '59 minutes' AND outcome = 'delivered';

-- name: OpsDeliveredEstimate :one
-- About how many delivered messages the retention holds, never counted:
-- the row counts PostgreSQL keeps for the delivered index of each
-- partition (pg_class.reltuples, as of the last VACUUM or ANALYZE; -1
-- before the first), so the ops page costs the same with a week of
-- history as with none.
SELECT COALESCE((SELECT sum(c.reltuples) FILTER (WHERE c.reltuples >= 0)
                 FROM pg_partition_tree(to_regclass('outbox_messages_delivered_idx')) t
                 JOIN pg_catalog.pg_class c ON c.oid = t.relid
                 WHERE t.isleaf), -1)::float8 AS delivered_estimate;

-- name: OpsEndpointAttemptStats :many
-- One endpoint's attempts of the last day and of the last hour (the current
-- minute and the 1,439 or 59 before it), from outbox_attempt_minutes: a
-- row for the attempts that were not delivered (delivered false, le_ms 0),
-- and one per request-time bucket of those that were, with the bucket's
-- bounds (lower_ms inclusive, le_ms exclusive) and its fastest and slowest
-- request, from which the caller estimates percentiles. At most 1,440
-- minutes of a few rows each, on the primary key, whatever the rate.
SELECT (s.outcome = 'delivered')::boolean AS delivered, s.le_ms,
       COALESCE((SELECT max(b) FROM unnest(outbox_latency_bounds_ms()) b WHERE b < s.le_ms), 0)::integer AS lower_ms,
       COALESCE(sum(s.attempts) FILTER (WHERE s.minute >= date_trunc('minute', now()) - interval '59 minutes'), 0)::bigint AS hour_attempts,
       COALESCE(min(s.min_ms) FILTER (WHERE s.minute >= date_trunc('minute', now()) - interval '59 minutes'), 0)::float8 AS hour_min_ms,
       COALESCE(max(s.max_ms) FILTER (WHERE s.minute >= date_trunc('minute', now()) - interval '59 minutes'), 0)::float8 AS hour_max_ms,
       sum(s.attempts)::bigint AS day_attempts,
       min(s.min_ms)::float8   AS day_min_ms,
       max(s.max_ms)::float8   AS day_max_ms
FROM outbox_attempt_minutes s
WHERE s.destination = @destination AND s.minute >= date_trunc('minute', now()) - interval '1439 minutes'
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: OpsEndpointRecentAttempts :many
-- One endpoint's latest attempts within the last day, newest first. An
-- attempt row does not name its endpoint (its message does), so the history
-- is read only in the minutes where the endpoint's sums
-- (outbox_attempt_minutes) say it had attempts, the newest minutes that
-- hold @max_rows of them; each minute is walked backwards on the
-- finished_at index until it has given @max_rows. A busy endpoint reads
-- the end of its latest minute; a quiet one beside busy ones reads its few
-- minutes, not the whole day of everyone's attempts.
WITH counted AS (
    SELECT minute, sum(attempts) AS attempts
    FROM outbox_attempt_minutes
    WHERE destination = @destination AND minute >= date_trunc('minute', now() - interval '1 day')
    GROUP BY minute
), chosen AS (
    SELECT minute
    FROM (SELECT minute, sum(attempts) OVER (ORDER BY minute DESC) - attempts AS newer FROM counted) c
    WHERE newer < @max_rows::integer
)
SELECT x.message_id, x.event_id, x.type, x.attempt, x.outcome, x.started_at, x.finished_at, x.status_code, x.error
FROM chosen c
CROSS JOIN LATERAL (
    SELECT a.message_id, m.event_id, m.type, a.attempt, a.outcome, a.started_at, a.finished_at, a.status_code, a.error
    FROM outbox_attempts a
    -- Each attempt's message by its primary key, as the minute is walked
    -- (OFFSET 0 keeps the planner from joining the other way: scanning the
    -- messages for the endpoint's, which no index finds once delivered).
    CROSS JOIN LATERAL (SELECT m.event_id, m.type, m.destination FROM outbox_messages m
                        WHERE m.id = a.message_id OFFSET 0) m
    WHERE a.finished_at >= c.minute AND a.finished_at < c.minute + interval '1 minute'
      AND a.finished_at >= now() - interval '1 day'
      AND m.destination = @destination
    ORDER BY a.finished_at DESC
    LIMIT @max_rows::integer
) x
ORDER BY x.finished_at DESC
LIMIT @max_rows::integer;

-- name: OpsDiscardWaiting :execrows
-- A person gives up on what waits for an endpoint that stays: up to
-- @batch_size of its pending messages, parked ones too, are settled as
-- discarded with @reason and are never sent; the caller loops. Messages in
-- flight finish as they will; failed ones keep waiting for a retry or a
-- skip. The outer status check is re-read after a concurrent claim, so a
-- message claimed meanwhile is left to its claim.
UPDATE outbox_messages
SET status = 'discarded', discarded_at = now(), last_error = @reason::text, parked = false
WHERE status = 'pending' AND id IN (
    SELECT u.id FROM (
        SELECT p.id FROM outbox_messages p WHERE p.destination = @destination AND p.status = 'pending' AND NOT p.parked
        UNION ALL
        SELECT w.id FROM outbox_messages w
        WHERE w.destination = @destination AND w.ordering_key IS NOT NULL AND w.status = 'pending' AND w.parked
    ) u
    LIMIT @batch_size
);

-- name: OpsEndpointDeliveryLag :many
-- One endpoint's delivery lags (commit to delivery) of the last day and of
-- the last hour, by bucket (outbox_delivery_lag_minutes), with the bucket's
-- bounds and its quickest and latest delivery, from which the caller
-- estimates percentiles. At most 1,440 minutes of a few rows each, on the
-- primary key.
SELECT s.le_ms,
       COALESCE((SELECT max(b) FROM unnest(outbox_lag_bounds_ms()) b WHERE b < s.le_ms), 0)::integer AS lower_ms,
       COALESCE(sum(s.deliveries) FILTER (WHERE s.minute >= date_trunc('minute', now()) - interval '59 minutes'), 0)::bigint AS hour_deliveries,
       COALESCE(min(s.min_ms) FILTER (WHERE s.minute >= date_trunc('minute', now()) - interval '59 minutes'), 0)::float8 AS hour_min_ms,
       COALESCE(max(s.max_ms) FILTER (WHERE s.minute >= date_trunc('minute', now()) - interval '59 minutes'), 0)::float8 AS hour_max_ms,
       sum(s.deliveries)::bigint AS day_deliveries,
       min(s.min_ms)::float8     AS day_min_ms,
       max(s.max_ms)::float8     AS day_max_ms
FROM outbox_delivery_lag_minutes s
WHERE s.destination = @destination AND s.minute >= date_trunc('minute', now()) - interval '1439 minutes'
GROUP BY 1
ORDER BY 1;

-- name: OpsDeliveryLagByEndpoint :many
-- Every endpoint's delivery lags of the last hour, by bucket, as
-- OpsEndpointDeliveryLag: which endpoint is latest, and the hour over all
-- of them. On the minute index: a row per endpoint, minute and bucket of
-- the hour.
SELECT s.destination, s.le_ms,
       COALESCE((SELECT max(b) FROM unnest(outbox_lag_bounds_ms()) b WHERE b < s.le_ms), 0)::integer AS lower_ms,
       sum(s.deliveries)::bigint AS deliveries,
       min(s.min_ms)::float8     AS min_ms,
       max(s.max_ms)::float8     AS max_ms
FROM outbox_delivery_lag_minutes s
WHERE s.minute >= date_trunc('minute', now()) - interval '59 minutes'
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: OpsDeliveryLagPerMinute :many
-- The delivery lags of every endpoint by minute and bucket since @since:
-- the overview's day, read a few minutes at a time (the admin keeps the
-- minutes that are over). On the minute index.
SELECT s.minute, s.le_ms,
       COALESCE((SELECT max(b) FROM unnest(outbox_lag_bounds_ms()) b WHERE b < s.le_ms), 0)::integer AS lower_ms,
       sum(s.deliveries)::bigint AS deliveries,
       min(s.min_ms)::float8     AS min_ms,
       max(s.max_ms)::float8     AS max_ms
FROM outbox_delivery_lag_minutes s
WHERE s.minute >= @since::timestamptz
GROUP BY 1, 2
ORDER BY 1, 2;
