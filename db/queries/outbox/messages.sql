-- name: MessageEnqueue :many
-- Fans one event out to a row per subscribed endpoint, in the caller's
-- transaction. Reading the endpoints and writing the rows is one statement:
-- one round trip on the order's write path. Disabled endpoints get their rows
-- too: disabled means paused, and the rows wait to be delivered after the
-- endpoint is enabled again.
INSERT INTO outbox_messages (type, destination, payload, trace_context)
SELECT @type::text, e.id, @payload::jsonb, sqlc.narg(trace_context)::jsonb
FROM webhook_endpoints e
WHERE @type::text = ANY (e.event_types)
RETURNING id;

-- name: MessageClaim :many
-- Claims up to @batch_size of one destination's due messages, oldest due
-- first, for the deliver job holding the destination's lease, in ONE
-- statement. The job sends what it claims at once, so a claim's age is the
-- age of its request: a claim never waits in a queue. SKIP LOCKED keeps
-- concurrent claimers from waiting on or duplicating each other. If the
-- lease is no longer this job's (its relay was declared dead, or the
-- endpoint was disabled or deleted), nothing is claimed. Each row comes with
-- the endpoint's URL and secrets as they are now, so a rotated secret takes
-- effect at the next claim. The attempt is counted when its outcome is
-- recorded, not here.
WITH lease AS (
    SELECT e.url, e.secret,
           COALESCE(CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret END, '')::text AS previous_secret
    FROM webhook_endpoints e
    WHERE e.id = @destination::uuid AND e.lease_token = @claim_token::uuid AND e.enabled
), due AS (
    SELECT p.id FROM outbox_messages p
    WHERE p.destination = @destination::uuid AND p.status = 'pending' AND p.next_attempt_at <= now()
      AND EXISTS (SELECT 1 FROM lease)
    ORDER BY p.next_attempt_at, p.id
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages m
SET status = 'claimed', claim_token = @claim_token::uuid, claimed_by = @relay_id::uuid, claimed_at = now()
FROM due, lease
WHERE m.id = due.id
RETURNING m.id, m.type, m.payload, m.attempts, m.created_at, m.trace_context,
          lease.url AS endpoint_url, lease.secret AS endpoint_secret, lease.previous_secret AS endpoint_previous_secret;

-- name: MessagesRecordOutcomes :execrows
-- Records outcomes and their attempts in one statement, only on rows the
-- job's claim token still holds: a job whose claims were released (its relay
-- was declared dead) finds nothing to change, and rows claimed since keep
-- the newer claim's story. An empty error keeps the previous one, so a
-- delivered row still shows what failed before it succeeded. No status
-- filter: the token implies 'claimed' (a CHECK ties them), and the primary
-- key finds the rows. @attempts is each message's attempt number, counted
-- from its last requeue; the history numbers it after the attempts made
-- before that requeue (attempts_before). ON CONFLICT keeps a rare double
-- record harmless.
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
        attempts = o.attempt,
        claim_token = NULL,
        claimed_at = NULL,
        claimed_by = NULL,
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

-- name: MessagesRelease :execrows
-- Returns claimed messages that were never sent (the job was stopped before
-- their request began) to pending as they were: no attempt is counted and
-- they are due again at once.
UPDATE outbox_messages
SET status = 'pending', claim_token = NULL, claimed_at = NULL, claimed_by = NULL
WHERE id = ANY (@ids::uuid[]) AND claim_token = @claim_token::uuid;

-- name: MessagesReleaseLost :execrows
-- Settles the claims of relays declared dead: their requests were in flight
-- and may have reached the receiver, so each counts as an attempt
-- ("interrupted") and the message is due again at once; at the attempt cap
-- it fails instead, so a message whose delivery kills its relay every time
-- cannot kill relays forever. This is the at-least-once window, by design.
WITH lost AS (
    SELECT id, attempts, attempts_before, claimed_at FROM outbox_messages
    WHERE status = 'claimed' AND claimed_by = ANY (@relay_ids::uuid[])
    FOR UPDATE SKIP LOCKED
), released AS (
    UPDATE outbox_messages m
    SET status = CASE WHEN m.attempts + 1 >= @max_attempts::integer THEN 'failed' ELSE 'pending' END,
        attempts = m.attempts + 1,
        claim_token = NULL,
        claimed_at = NULL,
        claimed_by = NULL,
        next_attempt_at = now(),
        last_error = @reason::text
    FROM lost
    WHERE m.id = lost.id
    RETURNING m.id
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, error)
SELECT l.id, l.attempts_before + l.attempts + 1, 'interrupted', l.claimed_at, now(), @reason::text
FROM lost l JOIN released r ON r.id = l.id
ON CONFLICT DO NOTHING;

-- name: MessageReleaseStale :execrows
-- The last resort: returns claims older than the claim timeout to pending
-- (or to failed at the attempt cap) and records the lost attempt, whatever
-- their relay. A claim lives as long as its request, so only a relay that is
-- alive but stuck leaves one this old; a dead relay's claims are released
-- within seconds by MessagesReleaseLost.
WITH stale AS (
    SELECT id, attempts, attempts_before, claimed_at FROM outbox_messages
    WHERE status = 'claimed'
      AND claimed_at < now() - make_interval(secs => @claim_timeout_seconds::float8)
    FOR UPDATE SKIP LOCKED
), released AS (
    UPDATE outbox_messages m
    SET status = CASE WHEN m.attempts + 1 >= @max_attempts::integer THEN 'failed' ELSE 'pending' END,
        attempts = m.attempts + 1,
        claim_token = NULL,
        claimed_at = NULL,
        claimed_by = NULL,
        next_attempt_at = now(),
        last_error = 'claim timed out: the relay did not record an outcome'
    FROM stale
    WHERE m.id = stale.id
    RETURNING m.id
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, error)
SELECT s.id, s.attempts_before + s.attempts + 1, 'timeout', s.claimed_at, now(), 'claim timed out: the relay did not record an outcome'
FROM stale s JOIN released r ON r.id = s.id
ON CONFLICT DO NOTHING;

-- name: AttemptsList :many
SELECT * FROM outbox_attempts WHERE message_id = @message_id ORDER BY attempt;

-- name: MessagesPrune :execrows
-- Deletes one bounded batch of settled rows (delivered or discarded) older
-- than the retention; the caller loops. Pending, claimed and failed rows are
-- never touched. Each status is walked by age on its own partial index.
DELETE FROM outbox_messages
WHERE id IN (
    (SELECT p.id FROM outbox_messages p
     WHERE p.status = 'delivered' AND p.delivered_at < @settled_before::timestamptz
     ORDER BY p.delivered_at
     LIMIT @batch_size)
    UNION ALL
    (SELECT p.id FROM outbox_messages p
     WHERE p.status = 'discarded' AND p.discarded_at < @settled_before::timestamptz
     ORDER BY p.discarded_at
     LIMIT @batch_size)
);

-- name: MessagesDiscardOrphans :execrows
-- Discards pending messages whose endpoint no longer exists: rows an order
-- transaction wrote while their endpoint was being deleted, which the
-- deletion's own discard could not see. A skip scan finds the destinations
-- with pending messages, one index probe each.
WITH RECURSIVE heads AS (
    (SELECT destination FROM outbox_messages
     WHERE status = 'pending' ORDER BY destination LIMIT 1)
    UNION ALL
    SELECT n.destination
    FROM heads h, LATERAL (
        SELECT m.destination FROM outbox_messages m
        WHERE m.status = 'pending' AND m.destination > h.destination
        ORDER BY m.destination LIMIT 1
    ) n
)
UPDATE outbox_messages m
SET status = 'discarded', discarded_at = now(), last_error = 'endpoint deleted'
FROM heads h
WHERE m.destination = h.destination AND m.status = 'pending'
  AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = h.destination);

-- name: MessageStats :one
-- Each count runs on its status's partial index.
SELECT
    (SELECT count(*) FROM outbox_messages WHERE status = 'pending')   AS pending,
    (SELECT count(*) FROM outbox_messages WHERE status = 'claimed')   AS claimed,
    (SELECT count(*) FROM outbox_messages WHERE status = 'delivered') AS delivered,
    (SELECT count(*) FROM outbox_messages WHERE status = 'failed')    AS failed,
    (SELECT count(*) FROM outbox_messages WHERE status = 'discarded') AS discarded,
    COALESCE(EXTRACT(epoch FROM now() - (
        SELECT min(created_at) FROM outbox_messages WHERE status = 'pending')), 0)::float8
        AS oldest_pending_age_seconds;

-- name: MessageBacklog :one
-- The monitoring numbers, without counting the delivered history.
SELECT
    (SELECT count(*) FROM outbox_messages WHERE status = 'pending') AS pending,
    (SELECT count(*) FROM outbox_messages WHERE status = 'claimed') AS claimed,
    (SELECT count(*) FROM outbox_messages WHERE status = 'failed')  AS failed,
    COALESCE(EXTRACT(epoch FROM now() - (
        SELECT min(created_at) FROM outbox_messages WHERE status = 'pending')), 0)::float8
        AS oldest_pending_age_seconds;

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
-- How long the oldest deliverable message has waited past its due time. A
-- message is deliverable when its endpoint is enabled and not backing off;
-- it is due from the later of its own next attempt and the end of its
-- endpoint's backoff. A healthy relay keeps this near the poll interval,
-- whatever waits for paused or failing endpoints. One index probe per
-- destination with pending messages (a skip scan), never a scan of them all.
WITH RECURSIVE heads AS (
    (SELECT destination, next_attempt_at FROM outbox_messages
     WHERE status = 'pending' ORDER BY destination, next_attempt_at LIMIT 1)
    UNION ALL
    SELECT n.destination, n.next_attempt_at
    FROM heads h, LATERAL (
        SELECT m.destination, m.next_attempt_at FROM outbox_messages m
        WHERE m.status = 'pending' AND m.destination > h.destination
        ORDER BY m.destination, m.next_attempt_at LIMIT 1
    ) n
)
SELECT COALESCE(EXTRACT(epoch FROM now() - min(GREATEST(h.next_attempt_at, e.backoff_until))), 0)::float8
FROM heads h
JOIN webhook_endpoints e ON e.id = h.destination
WHERE e.enabled AND GREATEST(h.next_attempt_at, e.backoff_until) <= now();

-- name: MessageGet :one
SELECT * FROM outbox_messages WHERE id = @id;

-- name: MessageRetry :one
-- A person's requeue of a failed message: back to pending, due now, with a
-- fresh attempt budget; attempts_before keeps the history's numbering going.
-- Only while its endpoint exists: a deleted endpoint's messages are settled.
UPDATE outbox_messages m
SET status = 'pending', attempts_before = attempts_before + attempts, attempts = 0, next_attempt_at = now()
WHERE m.id = @id AND m.status = 'failed'
  AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = m.destination)
RETURNING *;

-- name: MessagesDiscardForDestination :execrows
-- Settles every undelivered message of an endpoint being deleted, in the
-- deleting transaction: they will never be sent. Claimed ones lose their
-- claim, so the job sending them records nothing. Each status is found on
-- its own partial index, never by scanning the delivered history.
UPDATE outbox_messages
SET status = 'discarded', discarded_at = now(), last_error = @reason::text,
    claim_token = NULL, claimed_at = NULL, claimed_by = NULL
WHERE id IN (
    SELECT p.id FROM outbox_messages p WHERE p.destination = @destination AND p.status = 'pending'
    UNION ALL
    SELECT c.id FROM outbox_messages c WHERE c.destination = @destination AND c.status = 'claimed'
    UNION ALL
    SELECT f.id FROM outbox_messages f WHERE f.destination = @destination AND f.status = 'failed'
);
