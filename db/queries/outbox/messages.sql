-- name: EventEnqueue :one
-- Records one event and fans it out to a pending delivery per subscribed
-- endpoint, in the caller's transaction and in ONE statement: one round trip
-- on the order's write path. Disabled endpoints get their deliveries too:
-- disabled means paused, and they wait until the endpoint is enabled again.
--
-- An event with an ordering key first takes a transaction-scoped advisory
-- lock on the key, and only then reads the clock: a CASE evaluates its
-- WHEN conditions in order and a THEN only after its condition, so the
-- lock (a condition that is always true once taken) comes before
-- clock_timestamp(). Two transactions writing events of one key are
-- serialized, the second reads the clock after the first committed, and
-- ids and due times of one key follow commit order. The lock is in the
-- two-integer space, apart from River's, and costs nothing when the
-- business rows already serialize the key (an order's row lock does). It
-- is an expression, not a subquery, because this statement is on every
-- order's write path: an InitPlan and its scan cost more to set up than
-- the lock.
--
-- Subscribers are found with `event_types @> ARRAY[type]`, the form
-- webhook_endpoints_event_types_idx answers, so the write path does not
-- read every endpoint when there are many.
--
-- Each delivery's id shares its event's time prefix (outbox_uuid_sibling),
-- and a new delivery is due at the event's time, so within a key the claim's
-- order (next_attempt_at, id) is commit order.
WITH event AS (
    INSERT INTO outbox_events (id, type, payload, trace_context, ordering_key, created_at)
    SELECT outbox_uuid_v7_at(s.at), @type::text, @payload::json, sqlc.narg(trace_context)::jsonb,
           sqlc.narg(ordering_key)::text, s.at
    FROM (SELECT CASE WHEN sqlc.narg(ordering_key)::text IS NULL THEN clock_timestamp()
                      WHEN pg_advisory_xact_lock(1869574763, hashtext(sqlc.narg(ordering_key)::text)) IS NOT NULL
                          THEN clock_timestamp()
                 END AS at) s
    RETURNING id, type, ordering_key, created_at
), delivery AS (
    INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, next_attempt_at, created_at)
    SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, e.id, ev.ordering_key, ev.created_at, ev.created_at
    FROM event ev JOIN webhook_endpoints e ON e.event_types @> ARRAY[ev.type]
)
SELECT id FROM event;

-- name: EventNotify :exec
-- Wakes LISTENing relays at commit (NotifyRelays, OUTBOX_NOTIFY): names the
-- endpoints subscribed to @type, the destinations EventEnqueue gives the
-- event's deliveries, or '' (wake all) past what a notification's 8000
-- bytes hold; nothing when nobody subscribes. It needs only the type, not
-- the event's id, so it travels in the same round trip as EventEnqueue. An
-- endpoint subscribed or removed between the two statements only adds or
-- misses a wake-up, which the poll covers. Identical notifications of one
-- transaction are sent once.
SELECT pg_notify('outbox', CASE WHEN count(*) > 200 THEN '' ELSE string_agg(e.id::text, ',') END)
FROM webhook_endpoints e
WHERE e.event_types @> ARRAY[@type::text]
HAVING count(*) > 0;

-- name: AttemptsList :many
SELECT * FROM outbox_attempts WHERE message_id = @message_id ORDER BY attempt;

-- name: MessageStats :one
-- Each count runs on its status's partial index; parked messages (pending
-- behind an earlier message of their ordering key) on the ordering index.
SELECT
    ((SELECT count(*) FROM outbox_messages WHERE status = 'pending' AND NOT parked)
      + (SELECT count(*) FROM outbox_messages WHERE ordering_key IS NOT NULL AND status = 'pending' AND parked))::bigint AS pending,
    (SELECT count(*) FROM outbox_messages WHERE status = 'claimed')   AS claimed,
    (SELECT count(*) FROM outbox_messages WHERE status = 'delivered') AS delivered,
    (SELECT count(*) FROM outbox_messages WHERE status = 'failed')    AS failed,
    (SELECT count(*) FROM outbox_messages WHERE status = 'discarded') AS discarded,
    (SELECT count(*) FROM outbox_messages WHERE ordering_key IS NOT NULL AND status = 'pending' AND parked) AS parked,
    COALESCE(EXTRACT(epoch FROM now() - LEAST(
        (SELECT min(created_at) FROM outbox_messages WHERE status = 'pending' AND NOT parked),
        (SELECT min(created_at) FROM outbox_messages WHERE ordering_key IS NOT NULL AND status = 'pending' AND parked))), 0)::float8
        AS oldest_pending_age_seconds;

-- name: MessageList :many
-- Newest first with optional filters. Delivery ids are UUIDv7 with their
-- event's time, so the primary key orders by event time and doubles as the
-- pagination cursor, and a window of event time, [@events_from,
-- @events_to), is a range of it: always given (the caller widens a missing
-- bound), so that even a generic plan reads only the window.
--
-- The deliveries of @event_id share its first 64 bits: they are the range
-- of the primary key from its floor to its ceiling, and without an event
-- the range is every id; the page older than the cursor @before_id is the
-- range below it. Their bounds are never NULL, so a generic plan, too,
-- reads them as the index's bounds (the tightest of them and the window's
-- wins when the scan starts); behind "@event_id IS NULL OR", where they
-- were, a generic plan filtered every message of the window, or every one
-- newer than the cursor.
SELECT m.id, m.event_id, m.type, m.destination, m.status, m.attempts,
       m.parked, m.next_attempt_at,
       m.claimed_at, m.delivered_at, m.discarded_at, m.last_error, m.created_at, m.ordering_key,
       ev.created_at AS event_created_at, ev.payload
FROM outbox_messages m
JOIN outbox_events ev ON ev.id = m.event_id
WHERE (sqlc.narg(status)::text IS NULL OR m.status = sqlc.narg(status))
  AND (sqlc.narg(type)::text IS NULL OR m.type = sqlc.narg(type))
  AND (sqlc.narg(destination)::uuid IS NULL OR m.destination = sqlc.narg(destination))
  AND (sqlc.narg(event_id)::uuid IS NULL OR m.event_id = sqlc.narg(event_id))
  AND m.id BETWEEN outbox_uuid_floor(COALESCE(sqlc.narg(event_id)::uuid, '00000000-0000-0000-0000-000000000000'))
               AND outbox_uuid_ceil(COALESCE(sqlc.narg(event_id)::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
  AND m.id >= outbox_uuid_at(@events_from::timestamptz) AND m.id < outbox_uuid_at(@events_to::timestamptz)
  AND m.id < COALESCE(sqlc.narg(before_id)::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')
ORDER BY m.id DESC
LIMIT @max_rows;

-- name: MessageListByKey :many
-- MessageList for the events of one ordering key (an order's, say) written
-- from @events_from to @events_to. The key's index
-- (outbox_events_ordering_key_idx, on the key and the event id, which
-- begins with its time) reads the key's events in the window, newest
-- first, whatever the window's width: every event of an order, however
-- long after its placement; each event's deliveries come from the
-- deliveries' primary key, whose ids share the event's time prefix.
SELECT m.id, m.event_id, m.type, m.destination, m.status, m.attempts,
       m.parked, m.next_attempt_at,
       m.claimed_at, m.delivered_at, m.discarded_at, m.last_error, m.created_at, m.ordering_key,
       ev.created_at AS event_created_at, ev.payload
FROM outbox_events ev
CROSS JOIN LATERAL (
    -- One probe of the deliveries' primary key per event, which PostgreSQL
    -- prunes to the partition of the event's time; OFFSET 0 keeps it one,
    -- where a join over partitions may read every message instead.
    SELECT d.* FROM outbox_messages d
    WHERE d.id BETWEEN outbox_uuid_floor(ev.id) AND outbox_uuid_ceil(ev.id) AND d.event_id = ev.id
    OFFSET 0) m
WHERE ev.ordering_key = @ordering_key
  AND ev.id >= outbox_uuid_at(@events_from::timestamptz) AND ev.id < outbox_uuid_at(@events_to::timestamptz)
  AND (sqlc.narg(event_id)::uuid IS NULL OR ev.id = sqlc.narg(event_id))
  AND (sqlc.narg(status)::text IS NULL OR m.status = sqlc.narg(status))
  AND (sqlc.narg(type)::text IS NULL OR m.type = sqlc.narg(type))
  AND (sqlc.narg(destination)::uuid IS NULL OR m.destination = sqlc.narg(destination))
  AND (sqlc.narg(before_id)::uuid IS NULL OR m.id < sqlc.narg(before_id))
ORDER BY m.id DESC
LIMIT @max_rows;

-- name: EventExists :one
SELECT EXISTS (SELECT 1 FROM outbox_events WHERE id = @id);

-- name: MessageOverdue :one
-- How long the oldest deliverable message has waited past its due time. A
-- message is deliverable when its endpoint is enabled and not backing off;
-- it is due from the latest of its own next attempt, the end of its
-- endpoint's backoff, and its writing (a replayed message is due at its
-- event's time, to keep its key's order, but waits only since the replay).
-- A parked message is not due. A healthy relay keeps this near the poll
-- interval, whatever waits for paused or failing endpoints. One index probe
-- per destination with pending messages (a skip scan), never a scan of them
-- all.
WITH RECURSIVE heads AS (
    (SELECT destination, next_attempt_at, created_at FROM outbox_messages
     WHERE status = 'pending' AND NOT parked ORDER BY destination, next_attempt_at LIMIT 1)
    UNION ALL
    SELECT n.destination, n.next_attempt_at, n.created_at
    FROM heads h, LATERAL (
        SELECT m.destination, m.next_attempt_at, m.created_at FROM outbox_messages m
        WHERE m.status = 'pending' AND NOT m.parked AND m.destination > h.destination
        ORDER BY m.destination, m.next_attempt_at LIMIT 1
    ) n
)
SELECT COALESCE(EXTRACT(epoch FROM now() - min(GREATEST(h.next_attempt_at, h.created_at, e.backoff_until))), 0)::float8
FROM heads h
JOIN webhook_endpoints e ON e.id = h.destination
WHERE e.enabled AND GREATEST(h.next_attempt_at, h.created_at, e.backoff_until) <= now();
-- name: MessageGet :one
SELECT m.id, m.event_id, m.type, m.destination, m.status, m.attempts,
       m.parked, m.next_attempt_at,
       m.claimed_at, m.delivered_at, m.discarded_at, m.last_error, m.created_at, m.ordering_key,
       ev.created_at AS event_created_at, ev.payload
FROM outbox_messages m
JOIN outbox_events ev ON ev.id = m.event_id
WHERE m.id = @id;

-- name: MessageRetry :one
-- A person's requeue of a failed message: back to pending, due now, with a
-- fresh attempt budget; attempts_before keeps the history's numbering going
-- (and keeps it in the ordering index: it still holds back the later
-- messages of its key until it is delivered). Only while its endpoint
-- exists: a deleted endpoint's messages are settled.
UPDATE outbox_messages m
SET status = 'pending', attempts_before = attempts_before + attempts, attempts = 0, next_attempt_at = now()
WHERE m.id = @id AND m.status = 'failed'
  AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = m.destination)
RETURNING m.id;

-- name: MessageSkip :one
-- A person gives up on a failed message: it is settled as discarded, never
-- sent, and its key goes on: the caller runs it under the destination's
-- lock (DestinationLock) and promotes its key after it (MessagesPromote).
UPDATE outbox_messages
SET status = 'discarded', discarded_at = now(), last_error = @reason::text
WHERE id = @id AND status = 'failed'
RETURNING id, destination, ordering_key;

-- name: MessagesDiscardForDestination :execrows
-- Settles up to @batch_size undelivered messages of an endpoint being
-- deleted: they will never be sent. The deletion runs it in its own
-- transaction, after locking the endpoint's row (EndpointLockForDelete),
-- then in batches of their own (a day's backlog is millions of rows,
-- minutes of writing). Claimed ones lose their claim, so the job sending
-- them records nothing. SKIP LOCKED: it never waits for a message, so no
-- lock it holds can be part of a cycle (relay/order.go); a message locked
-- by a deliver job ending is left to that job, and whatever it leaves
-- pending to the orphan job (MessagesDiscardOrphans). Each status is found
-- on its own partial index, never by scanning the delivered history.
WITH candidates AS (
    SELECT u.id FROM (
        SELECT c.id FROM outbox_messages c WHERE c.destination = @destination AND c.status = 'claimed'
        UNION ALL
        SELECT f.id FROM outbox_messages f WHERE f.destination = @destination AND f.status = 'failed'
        UNION ALL
        SELECT w.id FROM outbox_messages w
        WHERE w.destination = @destination AND w.ordering_key IS NOT NULL AND w.status = 'pending' AND w.parked
        UNION ALL
        SELECT p.id FROM outbox_messages p WHERE p.destination = @destination AND p.status = 'pending' AND NOT p.parked
    ) u
    LIMIT @batch_size
), locked AS (
    SELECT m.id FROM outbox_messages m
    WHERE m.id = ANY (ARRAY(SELECT c.id FROM candidates c))
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages
SET status = 'discarded', discarded_at = now(), last_error = @reason::text,
    claim_token = NULL, claimed_at = NULL, claimed_by = NULL, parked = false
WHERE id IN (SELECT l.id FROM locked l)
-- Again outside the subquery: a message the relay recorded delivered
-- before this statement locked it is re-read here, and kept.
AND status IN ('claimed', 'failed', 'pending');
-- name: MessageKeyHead :one
-- What a parked message waits for: the first message that stands ahead of
-- it in its destination and key (outbox_key_ahead), one in flight or the
-- earliest unfinished before it. None means it waits only to be promoted.
SELECT b.id, b.status FROM outbox_messages b
WHERE b.id = (SELECT a.id FROM outbox_key_ahead(@destination::uuid, @ordering_key::text, @id::uuid) a
              ORDER BY a.status = 'claimed' DESC, a.id
              LIMIT 1);

-- name: MessagesParkedBehind :one
-- How many messages of a destination and ordering key are parked after @id:
-- what waits for a failed message to be retried or skipped.
SELECT count(*) FROM outbox_messages w
WHERE w.destination = @destination::uuid AND w.ordering_key = @ordering_key::text AND w.id > @id::uuid
  AND w.status = 'pending' AND w.parked;

-- name: MessageListNewer :many
-- The page of MessageList just newer than @after_id (the list's previous
-- page): the @max_rows messages above it, read oldest first from the
-- cursor up the primary key; the caller shows them newest first. An
-- event's range bounds it as it bounds MessageList.
SELECT m.id, m.event_id, m.type, m.destination, m.status, m.attempts,
       m.parked, m.next_attempt_at,
       m.claimed_at, m.delivered_at, m.discarded_at, m.last_error, m.created_at, m.ordering_key,
       ev.created_at AS event_created_at, ev.payload
FROM outbox_messages m
JOIN outbox_events ev ON ev.id = m.event_id
WHERE (sqlc.narg(status)::text IS NULL OR m.status = sqlc.narg(status))
  AND (sqlc.narg(type)::text IS NULL OR m.type = sqlc.narg(type))
  AND (sqlc.narg(destination)::uuid IS NULL OR m.destination = sqlc.narg(destination))
  AND (sqlc.narg(event_id)::uuid IS NULL OR m.event_id = sqlc.narg(event_id))
  AND m.id BETWEEN outbox_uuid_floor(COALESCE(sqlc.narg(event_id)::uuid, '00000000-0000-0000-0000-000000000000'))
               AND outbox_uuid_ceil(COALESCE(sqlc.narg(event_id)::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
  AND m.id >= outbox_uuid_at(@events_from::timestamptz) AND m.id < outbox_uuid_at(@events_to::timestamptz)
  AND m.id > @after_id
ORDER BY m.id
LIMIT @max_rows;

-- name: MessageListByKeyNewer :many
-- MessageListByKey's page just newer than @after_id, oldest first (as
-- MessageListNewer), reading the key's window from the cursor's time on.
SELECT m.id, m.event_id, m.type, m.destination, m.status, m.attempts,
       m.parked, m.next_attempt_at,
       m.claimed_at, m.delivered_at, m.discarded_at, m.last_error, m.created_at, m.ordering_key,
       ev.created_at AS event_created_at, ev.payload
FROM outbox_events ev
CROSS JOIN LATERAL (
    -- One probe of the deliveries' primary key per event, which PostgreSQL
    -- prunes to the partition of the event's time; OFFSET 0 keeps it one,
    -- where a join over partitions may read every message instead.
    SELECT d.* FROM outbox_messages d
    WHERE d.id BETWEEN outbox_uuid_floor(ev.id) AND outbox_uuid_ceil(ev.id) AND d.event_id = ev.id
    OFFSET 0) m
WHERE ev.ordering_key = @ordering_key
  AND ev.id >= outbox_uuid_at(@events_from::timestamptz) AND ev.id < outbox_uuid_at(@events_to::timestamptz)
  AND (sqlc.narg(event_id)::uuid IS NULL OR ev.id = sqlc.narg(event_id))
  AND (sqlc.narg(status)::text IS NULL OR m.status = sqlc.narg(status))
  AND (sqlc.narg(type)::text IS NULL OR m.type = sqlc.narg(type))
  AND (sqlc.narg(destination)::uuid IS NULL OR m.destination = sqlc.narg(destination))
  -- A delivery's id begins with its event's time: the events before the
  -- cursor's time hold none of the page, and are not read.
  AND ev.id >= outbox_uuid_floor(@after_id)
  AND m.id > @after_id
ORDER BY m.id
LIMIT @max_rows;
