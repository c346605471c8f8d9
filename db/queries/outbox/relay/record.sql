-- Recording: what came of each request, written back to its message.

-- name: MessagesRecordOutcomes :many
-- Records outcomes and their attempts in one statement, only on rows the
-- job's claim token still holds, and returns the rows it recorded: a job
-- whose claims were released (its relay was declared dead, or the claim
-- timed out) or discarded (its endpoint deleted) finds nothing to change,
-- and counts and logs only what it recorded. An empty error keeps the
-- previous one, so a delivered row still shows what failed before it
-- succeeded. No status filter: the token implies 'claimed' (a CHECK ties
-- them), and the primary key finds the rows. @attempts is each message's
-- attempt number, counted from its last requeue; the history numbers it
-- after the attempts made before that requeue (attempts_before). ON
-- CONFLICT keeps a rare double record harmless. The endpoint keeps its
-- latest attempt, success and error (what the ops page shows), each
-- replaced only by a later one, and the attempts are added to their
-- minute's sums (outbox_attempt_minutes), in key order so that two
-- recordings cannot deadlock, and each delivery's lag from its event
-- (@event_ats) to its minute's (outbox_delivery_lag_minutes). The caller
-- promotes the keys of the recorded messages after it (MessagesPromote),
-- under the destination's lock taken before it: every outcome lets its
-- key go on, or hands it to the next.
-- The release of lost claims (MessagesReleaseLost) repeats the upsert: a
-- function shared by the two cost the relay's small recordings more than
-- the lines it saves (docs/design.md).
WITH o AS (
    SELECT unnest(@ids::uuid[])                 AS id,
           unnest(@statuses::text[])            AS status,
           unnest(@delays_seconds::float8[])    AS delay_seconds,
           unnest(@last_errors::text[])         AS last_error,
           unnest(@attempts::integer[])         AS attempt,
           unnest(@outcomes::text[])            AS outcome,
           unnest(@started_ats::timestamptz[])  AS started_at,
           unnest(@finished_ats::timestamptz[]) AS finished_at,
           unnest(@status_codes::integer[])     AS status_code,
           unnest(@event_ats::timestamptz[])    AS event_at
), held AS (
    UPDATE outbox_messages m
    SET status = o.status,
        attempts = o.attempt,
        claim_token = NULL,
        claimed_at = NULL,
        claimed_by = NULL,
        delivered_at = CASE WHEN o.status = 'delivered' THEN now() END,
        failed_at = CASE WHEN o.status = 'failed' THEN now() END,
        next_attempt_at = CASE WHEN o.status = 'pending'
                               THEN now() + make_interval(secs => o.delay_seconds)
                               ELSE m.next_attempt_at END,
        last_error = COALESCE(NULLIF(o.last_error, ''), m.last_error)
    FROM o
    -- The attempt follows the row's count: an outcome recorded already
    -- (its answer lost, so the job put it back) finds the count past it,
    -- even on a later claim of the message by the same job.
    WHERE m.id = o.id AND m.claim_token = @claim_token::uuid AND m.attempts = o.attempt - 1
      -- The ids' range, as parameters: the partitions outside it are left
      -- out as the statement starts, not opened and then skipped (a one-
      -- outcome recording, the end of a job of one order fanned out to
      -- thousands of endpoints, spent most of its time opening a dozen).
      AND m.id >= @first_id::uuid AND m.id <= @last_id::uuid
    -- With the outcome it took (an outcome recorded already, flushed again
    -- beside the message's next, matches no row), so that the rest reads
    -- the recorded outcomes alone, and reads them without joining again: a
    -- join of two sets whose sizes the planner cannot know may be a nested
    -- loop, quadratic in the outcomes (seconds for a job's last few
    -- thousand).
    RETURNING m.id, m.attempts, m.attempts_before, m.status, m.destination, m.ordering_key,
              o.outcome, o.started_at, o.finished_at, o.status_code, o.last_error, o.event_at
), latest AS (
    SELECT h.destination,
           max(h.finished_at) AS attempt_at,
           (array_agg(h.outcome ORDER BY h.finished_at DESC))[1] AS attempt_outcome,
           max(h.finished_at) FILTER (WHERE h.outcome = 'delivered') AS success_at,
           max(h.finished_at) FILTER (WHERE h.outcome <> 'delivered') AS error_at,
           (array_agg(NULLIF(h.status_code, 0) ORDER BY h.finished_at DESC) FILTER (WHERE h.outcome <> 'delivered'))[1]
               AS error_status_code,
           (array_agg(NULLIF(h.last_error, '') ORDER BY h.finished_at DESC) FILTER (WHERE h.outcome <> 'delivered'))[1]
               AS error
    FROM held h
    GROUP BY h.destination
), endpoint AS (
    UPDATE webhook_endpoints e
    SET last_attempt_at = GREATEST(e.last_attempt_at, l.attempt_at),
        last_attempt_outcome = CASE WHEN e.last_attempt_at > l.attempt_at THEN e.last_attempt_outcome
                                    ELSE l.attempt_outcome END,
        last_success_at = GREATEST(e.last_success_at, l.success_at),
        last_error_at = GREATEST(e.last_error_at, l.error_at),
        last_error_status_code = CASE WHEN l.error_at IS NULL OR e.last_error_at > l.error_at THEN e.last_error_status_code
                                      ELSE l.error_status_code END,
        last_error = CASE WHEN l.error_at IS NULL OR e.last_error_at > l.error_at THEN e.last_error
                          ELSE l.error END
    FROM latest l
    WHERE e.id = l.destination
), summed AS (
    INSERT INTO outbox_attempt_minutes AS t (destination, minute, outcome, le_ms, attempts, min_ms, max_ms)
    SELECT h.destination, date_trunc('minute', h.finished_at), h.outcome,
           CASE WHEN h.outcome = 'delivered' THEN outbox_latency_bucket_ms(x.ms) ELSE 0 END,
           count(*), min(x.ms), max(x.ms)
    FROM held h
    CROSS JOIN LATERAL (SELECT GREATEST(EXTRACT(epoch FROM h.finished_at - h.started_at) * 1000, 0)::float8 AS ms) x
    GROUP BY 1, 2, 3, 4
    ORDER BY 1, 2, 3, 4
    ON CONFLICT (destination, minute, outcome, le_ms) DO UPDATE
    SET attempts = t.attempts + excluded.attempts,
        min_ms = LEAST(t.min_ms, excluded.min_ms),
        max_ms = GREATEST(t.max_ms, excluded.max_ms)
), lag AS (
    INSERT INTO outbox_delivery_lag_minutes AS t (destination, minute, le_ms, deliveries, min_ms, max_ms)
    SELECT h.destination, date_trunc('minute', h.finished_at), outbox_lag_bucket_ms(x.ms), count(*), min(x.ms), max(x.ms)
    FROM held h
    CROSS JOIN LATERAL (SELECT GREATEST(EXTRACT(epoch FROM h.finished_at - h.event_at) * 1000, 0)::float8 AS ms) x
    WHERE h.outcome = 'delivered'
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (destination, minute, le_ms) DO UPDATE
    SET deliveries = t.deliveries + excluded.deliveries,
        min_ms = LEAST(t.min_ms, excluded.min_ms),
        max_ms = GREATEST(t.max_ms, excluded.max_ms)
), history AS (
    INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
    SELECT h.id, h.attempts_before + h.attempts, h.outcome, h.started_at, h.finished_at,
           NULLIF(h.status_code, 0), NULLIF(h.last_error, '')
    FROM held h
    ON CONFLICT DO NOTHING
)
SELECT h.id, h.attempts, h.status FROM held h;

-- name: MessagesRelease :execrows
-- Returns claimed messages to pending as they were, due again at once and
-- with no attempt counted: those never sent (the job was stopped before
-- their request began), and those the receiver refused because the relay
-- itself sent too many at once (throttled, see pace.go): the relay's own
-- burst does not spend a message's attempts. The caller promotes their
-- keys after it.
UPDATE outbox_messages
SET status = 'pending', claim_token = NULL, claimed_at = NULL, claimed_by = NULL
WHERE id = ANY (@ids::uuid[]) AND claim_token = @claim_token::uuid;

-- name: MessagesReleaseByToken :many
-- MessagesRelease for a job that lost track of what it claimed: a claim
-- statement that failed on the way back (the connection dropped after it
-- committed) leaves rows claimed under the job's token that the job never
-- saw. Run at the job's end, after its outcomes are recorded, so whatever
-- is still claimed under its token had no request: it goes back to pending
-- as it was, rather than waiting out the claim timeout and being charged an
-- attempt it never made. Reads the claimed rows (as many as are in flight
-- everywhere), so it runs only after a claim failed. Returns the ordering
-- keys of the messages it released, for the caller to promote.
UPDATE outbox_messages
SET status = 'pending', claim_token = NULL, claimed_at = NULL, claimed_by = NULL
WHERE status = 'claimed' AND claim_token = @claim_token::uuid
RETURNING ordering_key;
