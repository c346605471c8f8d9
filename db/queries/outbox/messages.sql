-- name: MessageEnqueue :many
-- Fans one event out to a row per subscribed, enabled endpoint, in the
-- caller's transaction. Reading the endpoints and writing the rows is one
-- statement: one round trip on the order's write path.
INSERT INTO outbox_messages (type, destination, payload, trace_context)
SELECT @type::text, e.id, @payload::jsonb, sqlc.narg(trace_context)::jsonb
FROM webhook_endpoints e
WHERE e.enabled AND @type::text = ANY (e.event_types)
RETURNING id;

-- name: MessageClaim :many
-- Moves up to @batch_size due pending rows to claimed in ONE statement, oldest
-- due first. SKIP LOCKED makes concurrent claimers partition the rows rather
-- than wait for or duplicate each other. The claim counts as an attempt, so a
-- message whose delivery kills the relay still reaches the attempt cap.
WITH due AS (
    SELECT id FROM outbox_messages
    WHERE status = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages m
SET status = 'claimed', claim_token = @claim_token::uuid, claimed_at = now(), attempts = m.attempts + 1
FROM due
WHERE m.id = due.id
RETURNING m.id, m.destination;

-- name: MessageWorkDue :one
-- Whether a claim job has anything to do: a due pending message, or a claim
-- past the claim timeout. Two probes of partial indexes, so an idle relay
-- can look often for almost nothing.
SELECT (EXISTS (
            SELECT 1 FROM outbox_messages
            WHERE status = 'pending' AND next_attempt_at <= now())
        OR EXISTS (
            SELECT 1 FROM outbox_messages
            WHERE status = 'claimed'
              AND claimed_at < now() - make_interval(secs => @claim_timeout_seconds::float8)))::boolean
       AS due;

-- name: MessageClaimedCount :one
-- Rows claimed and not yet settled: the relay's work in flight, bounded so a
-- claim never runs further ahead of delivery than the claim timeout allows.
SELECT count(*) FROM outbox_messages WHERE status = 'claimed';

-- name: MessageReleaseStale :execrows
-- Returns claims older than the claim timeout (their relay died) to pending,
-- or to failed once the attempt cap is reached, and records the lost attempt.
-- Delivery may have happened before the crash: this is the at-least-once
-- window, by design.
WITH stale AS (
    SELECT id, attempts, attempts_before, claimed_at FROM outbox_messages
    WHERE status = 'claimed'
      AND claimed_at < now() - make_interval(secs => @claim_timeout_seconds::float8)
    FOR UPDATE SKIP LOCKED
), released AS (
    UPDATE outbox_messages m
    SET status = CASE WHEN m.attempts >= @max_attempts::integer THEN 'failed' ELSE 'pending' END,
        claim_token = NULL,
        claimed_at = NULL,
        next_attempt_at = now(),
        last_error = 'claim timed out: the relay did not record an outcome'
    FROM stale
    WHERE m.id = stale.id
    RETURNING m.id
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, error)
SELECT s.id, s.attempts_before + s.attempts, 'timeout', s.claimed_at, now(), 'claim timed out: the relay did not record an outcome'
FROM stale s JOIN released r ON r.id = s.id
ON CONFLICT DO NOTHING;

-- name: MessagesForDelivery :many
-- The rows a deliver job was given, only while its claim still holds. The
-- endpoint is joined at delivery so a rotated secret or URL takes effect.
-- The token alone identifies the claim (a CHECK ties claim_token to status
-- 'claimed'); a status filter here would let the planner scan the partial
-- claimed index, a cost that grows with every message in flight, instead of
-- looking each id up by primary key (docs/PERFORMANCE.md).
SELECT m.id, m.type, m.destination, m.payload, m.attempts, m.created_at, m.trace_context,
       e.url AS endpoint_url, e.secret AS endpoint_secret, e.enabled AS endpoint_enabled,
       COALESCE(CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret END, '')::text AS endpoint_previous_secret
FROM outbox_messages m
LEFT JOIN webhook_endpoints e ON e.id = m.destination
WHERE m.id = ANY (@ids::uuid[]) AND m.claim_token = @claim_token::uuid
ORDER BY m.id;

-- name: MessagesRecordOutcomes :execrows
-- Records a deliver job's outcomes and their attempts in one statement, only
-- on rows the job's claim token still holds: a stale job finds nothing to
-- change, and rows re-claimed since keep the newer claim's story. An empty
-- error keeps the previous one, so a delivered row still shows what failed
-- before it succeeded. No status filter, as in MessagesForDelivery: the
-- token implies 'claimed' and the primary key finds the rows. Attempts are
-- numbered after those made before a person's requeue (attempts_before); a
-- River retry of a job whose first run never committed records its attempt
-- once, and ON CONFLICT keeps a rare double record harmless.
WITH o AS (
    SELECT unnest(@ids::uuid[])                 AS id,
           unnest(@statuses::text[])            AS status,
           unnest(@delays_seconds::float8[])    AS delay_seconds,
           unnest(@last_errors::text[])         AS last_error,
           unnest(@attempts::integer[])         AS attempt,
           unnest(@outcomes::text[])            AS outcome,
           unnest(@started_ats::timestamptz[])  AS started_at,
           unnest(@finished_ats::timestamptz[]) AS finished_at,
           unnest(@status_codes::integer[])     AS status_code
), held AS (
    UPDATE outbox_messages m
    SET status = o.status,
        claim_token = NULL,
        claimed_at = NULL,
        delivered_at = CASE WHEN o.status = 'delivered' THEN now() END,
        next_attempt_at = CASE WHEN o.status = 'pending'
                               THEN now() + make_interval(secs => o.delay_seconds)
                               ELSE m.next_attempt_at END,
        last_error = COALESCE(NULLIF(o.last_error, ''), m.last_error)
    FROM o
    WHERE m.id = o.id AND m.claim_token = @claim_token::uuid
    RETURNING m.id, m.attempts_before
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
SELECT h.id, h.attempts_before + o.attempt, o.outcome, o.started_at, o.finished_at,
       NULLIF(o.status_code, 0), NULLIF(o.last_error, '')
FROM held h JOIN o ON o.id = h.id
ON CONFLICT DO NOTHING;

-- name: AttemptsList :many
SELECT * FROM outbox_attempts WHERE message_id = @message_id ORDER BY attempt;

-- name: MessagesPrune :execrows
-- Deletes one bounded batch of delivered rows older than the retention; the
-- caller loops. Pending, claimed and failed rows are never touched.
DELETE FROM outbox_messages
WHERE id IN (
    SELECT p.id FROM outbox_messages p
    WHERE p.status = 'delivered' AND p.delivered_at < @delivered_before::timestamptz
    ORDER BY p.delivered_at
    LIMIT @batch_size
);

-- name: MessageStats :one
-- Each count runs on its status's partial index.
SELECT
    (SELECT count(*) FROM outbox_messages WHERE status = 'pending')   AS pending,
    (SELECT count(*) FROM outbox_messages WHERE status = 'claimed')   AS claimed,
    (SELECT count(*) FROM outbox_messages WHERE status = 'delivered') AS delivered,
    (SELECT count(*) FROM outbox_messages WHERE status = 'failed')    AS failed,
    COALESCE(EXTRACT(epoch FROM now() - (
        SELECT min(created_at) FROM outbox_messages WHERE status = 'pending')), 0)::float8
        AS oldest_pending_age_seconds;

-- name: MessageBacklog :one
-- The monitoring numbers, without counting the delivered history. Overdue is
-- how long the oldest due message has waited past its due time: near the
-- poll interval when the relay keeps up, whatever is backing off.
SELECT
    (SELECT count(*) FROM outbox_messages WHERE status = 'pending') AS pending,
    (SELECT count(*) FROM outbox_messages WHERE status = 'claimed') AS claimed,
    (SELECT count(*) FROM outbox_messages WHERE status = 'failed')  AS failed,
    COALESCE(EXTRACT(epoch FROM now() - (
        SELECT min(created_at) FROM outbox_messages WHERE status = 'pending')), 0)::float8
        AS oldest_pending_age_seconds,
    COALESCE(EXTRACT(epoch FROM now() - (
        SELECT min(next_attempt_at) FROM outbox_messages
        WHERE status = 'pending' AND next_attempt_at <= now())), 0)::float8
        AS oldest_due_overdue_seconds;

-- name: MessageList :many
-- Newest first with optional filters. Ids are UUIDv7, so the primary key
-- orders by creation time and doubles as the pagination cursor.
SELECT * FROM outbox_messages
WHERE (sqlc.narg(status)::text IS NULL OR status = sqlc.narg(status))
  AND (sqlc.narg(type)::text IS NULL OR type = sqlc.narg(type))
  AND (sqlc.narg(destination)::uuid IS NULL OR destination = sqlc.narg(destination))
  AND (sqlc.narg(created_from)::timestamptz IS NULL OR created_at >= sqlc.narg(created_from))
  AND (sqlc.narg(created_to)::timestamptz IS NULL OR created_at < sqlc.narg(created_to))
  AND (sqlc.narg(before_id)::uuid IS NULL OR id < sqlc.narg(before_id))
ORDER BY id DESC
LIMIT @max_rows;

-- name: MessageOverdue :one
-- How long the oldest due pending message has waited past its due time: a
-- healthy relay keeps this near the poll interval, whatever the backlog of
-- messages that are backing off.
SELECT COALESCE(EXTRACT(epoch FROM now() - min(next_attempt_at)), 0)::float8
FROM outbox_messages
WHERE status = 'pending' AND next_attempt_at <= now();

-- name: MessageGet :one
SELECT * FROM outbox_messages WHERE id = @id;

-- name: MessageRetry :one
-- A person's requeue of a failed message: back to pending, due now, with a
-- fresh attempt budget; attempts_before keeps the history's numbering going.
UPDATE outbox_messages
SET status = 'pending', attempts_before = attempts_before + attempts, attempts = 0, next_attempt_at = now()
WHERE id = @id AND status = 'failed'
RETURNING *;
