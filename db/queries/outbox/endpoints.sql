-- name: EndpointInsert :one
-- The id is chosen by the caller: a sealed secret is bound to it, and a
-- form submitted twice carries the same one. An id that exists inserts
-- nothing and returns no row.
INSERT INTO webhook_endpoints (id, url, secret, event_types)
VALUES (@id, @url, @secret, @event_types)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: EndpointGet :one
SELECT * FROM webhook_endpoints WHERE id = @id;

-- name: EndpointList :many
SELECT * FROM webhook_endpoints ORDER BY created_at, id;

-- name: EndpointLockForDelete :one
-- A deletion locks the endpoint's row right after the destination's lock:
-- it waits for a recording in progress, and holds nothing else meanwhile,
-- so it cannot be part of a cycle of waits (relay/order.go).
SELECT id FROM webhook_endpoints WHERE id = @id FOR UPDATE;

-- name: EndpointDelete :execrows
DELETE FROM webhook_endpoints WHERE id = @id;

-- name: EndpointSetEnabled :one
-- Pauses or resumes an endpoint. Messages for a paused endpoint are written
-- and wait; resuming an endpoint that is backing off also probes it at once
-- (with MessageProbeNow before it), instead of at its next scheduled probe,
-- while a healthy one's Retry-After
-- (backoff_until too) stands: the receiver asked for that wait. Pausing an
-- endpoint already paused keeps when and why it was (a 410's reason is not
-- replaced by the person's).
UPDATE webhook_endpoints
SET enabled = @enabled,
    disabled_reason = CASE WHEN @enabled::boolean THEN NULL
                           WHEN NOT enabled THEN disabled_reason
                           ELSE @reason END,
    disabled_at = CASE WHEN @enabled::boolean THEN NULL
                       WHEN NOT enabled THEN COALESCE(disabled_at, updated_at)
                       ELSE now() END,
    backoff_until = CASE WHEN @enabled::boolean AND health = 'backing_off' AND backoff_until > now() THEN now()
                         ELSE backoff_until END,
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: MessageProbeNow :execrows
-- A person's "probe now" (EndpointSetEnabled on an endpoint backing off)
-- ends the backoff, but the probe sends a due message, and after a long
-- outage every waiting one may have been tried and sent into a retry hours
-- away: this makes the one due first due now, so the probe goes at once.
-- Nothing when one is due already or the endpoint is not backing off. Run
-- before EndpointSetEnabled in its transaction: messages are locked before
-- the endpoint, as everywhere else (see MessagesBringForward).
UPDATE outbox_messages m
SET next_attempt_at = now()
WHERE m.id = (SELECT p.id FROM outbox_messages p
              WHERE p.destination = @destination::uuid AND p.status = 'pending' AND NOT p.parked
              ORDER BY p.next_attempt_at, p.id
              LIMIT 1)
  AND m.next_attempt_at > now()
  AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = @destination::uuid AND e.health = 'backing_off');

-- name: EndpointRotateSecret :one
-- Replaces the signing secret, keeping the old one valid for @overlap_seconds:
-- until then every delivery carries a signature with each. Refused (no row)
-- while an earlier rotation's overlap still runs, unless @overlap_seconds
-- is 0: the relay signs with two secrets at most, so a second rotation
-- would drop the previous one while receivers may still use it (a client
-- retrying a rotation whose answer was lost, two operators), whereas one
-- with no overlap means to end every earlier secret now (a leaked one).
-- Refused too when @idempotency_key (NULL for none) is the key of the
-- rotation already made: its repeat is answered with that rotation. When
-- @guarded, only if the last rotation is still the one the caller saw
-- (@seen_previous_expires_at, NULL for none): a second submission of one
-- confirmation would otherwise make the secret it just showed the
-- "previous" one and drop the one the receiver still uses.
-- EndpointRotation says which refused it.
UPDATE webhook_endpoints
SET previous_secret = secret,
    previous_secret_expires_at = now() + make_interval(secs => @overlap_seconds::float8),
    secret = @secret,
    secret_rotated_at = now(),
    secret_rotation_overlap = make_interval(secs => @overlap_seconds::float8),
    secret_rotation_key = sqlc.narg(idempotency_key)::text,
    updated_at = now()
WHERE id = @id
  AND (@overlap_seconds::float8 = 0 OR previous_secret_expires_at IS NULL OR previous_secret_expires_at <= now())
  AND (sqlc.narg(idempotency_key)::text IS NULL OR secret_rotation_key IS DISTINCT FROM sqlc.narg(idempotency_key)::text)
  AND (NOT @guarded::boolean OR previous_secret_expires_at IS NOT DISTINCT FROM sqlc.narg(seen_previous_expires_at)::timestamptz)
RETURNING *;

-- name: EndpointRotation :one
-- An endpoint's last rotation as a refused EndpointRotateSecret asked for
-- it, read in its transaction: same_key, it was made under
-- @idempotency_key; same_overlap, with @overlap_seconds; recent, less than
-- @shown_for_seconds ago (its secret is shown again only then);
-- overlapping, its previous secret still signs.
SELECT sqlc.embed(webhook_endpoints),
       COALESCE(secret_rotation_key = sqlc.narg(idempotency_key)::text, false)::boolean AS same_key,
       COALESCE(secret_rotation_overlap = make_interval(secs => @overlap_seconds::float8), false)::boolean AS same_overlap,
       COALESCE(secret_rotated_at > now() - make_interval(secs => @shown_for_seconds::float8), false)::boolean AS recent,
       COALESCE(previous_secret_expires_at > now(), false)::boolean AS overlapping
FROM webhook_endpoints
WHERE id = @id;

-- name: EndpointSecretsBatch :many
-- One batch of a re-encryption: the endpoints after @after in id order,
-- locked so a rotation waits rather than being overwritten. previous_expired:
-- the previous secret no longer signs (its overlap is over).
SELECT id, secret, previous_secret,
       COALESCE(previous_secret_expires_at <= now(), false)::boolean AS previous_expired
FROM webhook_endpoints
WHERE id > @after
ORDER BY id
LIMIT @batch_size
FOR UPDATE;

-- name: EndpointSecretsSet :exec
-- Stores an endpoint's secrets re-encrypted: the same secrets, so neither
-- updated_at nor the previous secret's expiry changes; a NULL previous
-- secret (one whose overlap is over) is dropped with its expiry.
UPDATE webhook_endpoints
SET secret = @secret,
    previous_secret = sqlc.narg(previous_secret),
    previous_secret_expires_at = CASE WHEN sqlc.narg(previous_secret)::text IS NULL THEN NULL ELSE previous_secret_expires_at END
WHERE id = @id;

-- name: EndpointStates :one
-- Endpoints by state, as the API names them: paused when disabled, else
-- their health.
SELECT count(*) FILTER (WHERE enabled AND health = 'healthy')     AS healthy,
       count(*) FILTER (WHERE enabled AND health = 'backing_off') AS backing_off,
       count(*) FILTER (WHERE NOT enabled)                        AS paused
FROM webhook_endpoints;

-- name: EndpointsExisting :many
-- Which of @ids are still endpoints: the relay drops the metric series of
-- the others (deleted endpoints).
SELECT id FROM webhook_endpoints WHERE id = ANY (@ids::uuid[]);

-- name: EndpointUpdate :one
-- Changes an endpoint's URL and event types in place (NULL keeps one as it
-- is). Its messages already written stay and are sent to the new URL; the
-- new types apply to events written from now on. A new URL is a new
-- destination, and the old one's health says nothing of it: its circuit,
-- its failures in a row, a Retry-After's wait and its pace are reset (and
-- a deliver job serving the old one leaves them so: DestinationSettle), so
-- it is tried at once instead of at the old destination's next probe (with
-- MessageProbeNow before it, in its transaction, for a message whose own
-- retry is later).
UPDATE webhook_endpoints
SET url = COALESCE(sqlc.narg(url), url),
    event_types = COALESCE(sqlc.narg(event_types)::text[], event_types),
    health = CASE WHEN sqlc.narg(url)::text <> url THEN 'healthy' ELSE health END,
    health_reason = CASE WHEN sqlc.narg(url)::text <> url THEN NULL ELSE health_reason END,
    health_changed_at = CASE WHEN sqlc.narg(url)::text <> url AND health <> 'healthy' THEN now() ELSE health_changed_at END,
    consecutive_failures = CASE WHEN sqlc.narg(url)::text <> url THEN 0 ELSE consecutive_failures END,
    backoff_until = CASE WHEN sqlc.narg(url)::text <> url THEN NULL ELSE backoff_until END,
    pace = CASE WHEN sqlc.narg(url)::text <> url THEN NULL ELSE pace END,
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: EndpointReplay :one
-- One bounded batch of a replay: the events written in [@from, @to) after
-- the cursor @after, of the endpoint's subscribed types (and of @types
-- unless it is empty), oldest first, each given a new pending message for
-- the endpoint under its original event id, unless one of its messages to
-- the endpoint is still unfinished (pending, claimed or failed): a replay
-- never sends an event twice at once. A replayed message takes its
-- event's place in the destination's queue: its id is the event's sibling
-- and it is due at the event's time, like the message the event was first
-- written with, so the claim (oldest due first) reaches it before any
-- later message of its key, however many others are due; and it is never
-- sent while a message of its key is in flight (MessageClaim). A receiver
-- rebuilding its state from a replay thus gets an order's placed before
-- its cancelled. Its created_at is the replay's time: what waits is
-- measured from it (MessageOverdue, the oldest pending age). Returns how
-- many events the batch read and replayed, and the cursor to go on from
-- (the nil uuid when the range is done): the last event read when the
-- batch is full, else the last one scanned when the scan is.
-- A batch scans at most @scan_limit events of the range, of any type, so a
-- replay of a type that is rare in a long range is many short statements,
-- not one that walks the whole range while the prune waits.
-- The caller holds EventsLockReplay, so the prune cannot delete an event
-- under it.
WITH ep AS (
    SELECT e.id, e.event_types FROM webhook_endpoints e WHERE e.id = @endpoint::uuid
), scanned AS (
    SELECT ev.id, ev.type, ev.ordering_key, ev.created_at
    FROM outbox_events ev
    WHERE ev.id >= outbox_uuid_at(@from_time::timestamptz) AND ev.id < outbox_uuid_at(@to_time::timestamptz)
      AND ev.created_at >= @from_time::timestamptz AND ev.created_at < @to_time::timestamptz
      -- Never NULL, so even a generic plan starts the index scan at the
      -- cursor: "@after IS NULL OR" made it a filter, and each batch read
      -- the range from its start to the cursor again.
      AND ev.id > COALESCE(sqlc.narg(after)::uuid, '00000000-0000-0000-0000-000000000000')
    ORDER BY ev.id
    LIMIT @scan_limit::integer
), batch AS (
    SELECT s.id, s.type, s.ordering_key, s.created_at
    FROM scanned s, ep
    WHERE s.type = ANY (ep.event_types)
      AND (COALESCE(cardinality(@types::text[]), 0) = 0 OR s.type = ANY (@types::text[]))
    ORDER BY s.id
    LIMIT @batch_size::integer
), fresh AS (
    SELECT b.id, b.type, b.ordering_key, b.created_at FROM batch b
    WHERE NOT EXISTS (
        SELECT 1 FROM outbox_messages m
        WHERE m.id BETWEEN outbox_uuid_floor(b.id) AND outbox_uuid_ceil(b.id)
          AND m.event_id = b.id AND m.destination = @endpoint::uuid
          AND m.status IN ('pending', 'claimed', 'failed')
        OFFSET 0)
), replayed AS (
    INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, next_attempt_at, created_at)
    SELECT outbox_uuid_sibling(f.id), f.id, f.type, @endpoint::uuid, f.ordering_key, f.created_at, now()
    FROM fresh f
    RETURNING 1
)
SELECT (SELECT count(*) FROM batch)    AS read,
       (SELECT count(*) FROM replayed) AS replayed,
       COALESCE(CASE
           WHEN (SELECT count(*) FROM batch) = @batch_size::integer THEN (SELECT b.id FROM batch b ORDER BY b.id DESC LIMIT 1)
           WHEN (SELECT count(*) FROM scanned) = @scan_limit::integer THEN (SELECT s.id FROM scanned s ORDER BY s.id DESC LIMIT 1)
       END, '00000000-0000-0000-0000-000000000000')::uuid AS next;

-- name: EndpointReplayCount :one
-- How many events a replay of [@from, @to) after the cursor @after would
-- read for the endpoint (what a dry run and the ops page's confirmation
-- say), among at most @scan_limit events of the range, of any type: as
-- much as a replay's batch scans, so a dry run costs what the call it
-- previews does, however wide the range (counting all of it read every
-- event of the range: 0.4 s at 2,000,000, and forty at once slowed the
-- orders beside them). next is the last event scanned when the scan was
-- full, to count on from; the nil uuid when the range is done.
WITH scanned AS (
    SELECT ev.id, ev.type
    FROM outbox_events ev
    WHERE ev.id >= outbox_uuid_at(@from_time::timestamptz) AND ev.id < outbox_uuid_at(@to_time::timestamptz)
      AND ev.created_at >= @from_time::timestamptz AND ev.created_at < @to_time::timestamptz
      AND ev.id > COALESCE(sqlc.narg(after)::uuid, '00000000-0000-0000-0000-000000000000')
    ORDER BY ev.id
    LIMIT @scan_limit::integer
)
SELECT (SELECT count(*) FROM scanned s
        -- The endpoint's types, read once (an InitPlan), not joined to
        -- each event scanned.
        WHERE s.type = ANY ((SELECT e.event_types FROM webhook_endpoints e WHERE e.id = @endpoint::uuid)::text[])
          AND (COALESCE(cardinality(@types::text[]), 0) = 0 OR s.type = ANY (@types::text[]))) AS events,
       COALESCE(CASE WHEN (SELECT count(*) FROM scanned) = @scan_limit::integer
                     THEN (SELECT s.id FROM scanned s ORDER BY s.id DESC LIMIT 1) END,
                '00000000-0000-0000-0000-000000000000')::uuid AS next;

-- name: EventsLockReplay :exec
-- Taken (shared) by a replay's transaction before it reads events, and
-- (exclusive) by each batch of the event prune before it deletes: a replay
-- never gives a message to an event being deleted, and replays of
-- different endpoints do not wait for one another here (EndpointLockReplay
-- orders those of one endpoint). Its own statement, so the next one's
-- snapshot is taken with the lock held.
SELECT pg_advisory_xact_lock_shared(1869574764, 0);

-- name: EndpointLockReplay :exec
-- Taken by a replay's transaction, after EventsLockReplay and before it
-- looks for the endpoint's unfinished messages: the batches of replays of
-- one endpoint run one at a time, so each sees the copies the one before
-- it made (two at once would each miss the other's uncommitted rows and
-- both insert).
-- Its own statement, for the same reason as EventsLockReplay.
SELECT pg_advisory_xact_lock(1869574765, hashtext(CAST(@endpoint::uuid AS text)));

-- name: EndpointNextAttempts :many
-- When each of @ids is next tried: the later of its backoff (a circuit's
-- next probe, or the end of a Retry-After) and the earliest next attempt
-- of its pending messages, parked ones aside (they wait for an earlier
-- message, not for a time). An endpoint with no such message has no row:
-- nothing waits to be tried (one in flight is being tried now), whatever
-- its backoff. Its earliest message is its first entry in the pending
-- index (destination, next_attempt_at, id): one index probe per endpoint,
-- however large its backlog. now is the database's clock, which wrote the
-- times.
SELECT e.id, GREATEST(m.next_attempt_at, e.backoff_until)::timestamptz AS next_attempt_at,
       now()::timestamptz AS now
FROM webhook_endpoints e
CROSS JOIN LATERAL (
    SELECT m.next_attempt_at FROM outbox_messages m
    WHERE m.destination = e.id AND m.status = 'pending' AND NOT m.parked
    ORDER BY m.next_attempt_at
    LIMIT 1
) m
WHERE e.id = ANY (@ids::uuid[]);
