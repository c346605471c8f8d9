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

-- name: MessageClaim :many
-- Claims up to @batch_size of one destination's due messages, oldest due
-- first, for the deliver job holding the destination's lease, in ONE
-- statement. The job sends what it claims at once, so a claim's age is the
-- age of its request: a claim never waits in a queue. SKIP LOCKED keeps
-- the claim from waiting on a deletion's discard. If the lease is no longer
-- this job's (its relay was declared dead, or the endpoint was disabled or
-- deleted), nothing is claimed. Each row comes with its event (payload,
-- trace context) and the endpoint's URL and secrets as they are now, so a
-- rotated secret takes effect at the next claim. The attempt is counted
-- when its outcome is recorded, not here.
--
-- Per-key order: a due message with an ordering key is claimed only if it
-- is the first of its key among those due, no earlier message of its key
-- is unfinished, and none of its key is claimed (on
-- outbox_messages_ordering_idx). The last holds a replayed event (whose
-- message takes its event's place in the key, EndpointReplay) while a
-- later message of its key is in flight: one message of a key is in
-- flight at a time, whatever their ids. (The lookup repeats the ordering
-- index's predicate, so it is one probe of that index: written as "claimed,
-- or earlier and unfinished", PostgreSQL read every claimed message of
-- every destination for each keyed one.) Otherwise it is parked:
-- out of the pending index, so out of every later claim's way, until the
-- message ahead of it settles and promotes it (MessagesRecordOutcomes,
-- MessageSkip). New messages of a key are due in commit order, so the first
-- of a key among the due ones is never behind one that is not due.
--
-- Run under a generic plan (TransactionPlanGeneric): planned per call,
-- this statement takes about as long to plan as to run, and PostgreSQL
-- keeps planning it because it misjudges the generic plan's cost. The
-- updates find their rows by = ANY (ARRAY(...)) so the generic plan reads
-- them on the primary key, as a custom plan does.
WITH lease AS (
    SELECT e.url, e.secret,
           COALESCE(CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret END, '')::text AS previous_secret
    FROM webhook_endpoints e
    WHERE e.id = @destination::uuid AND e.lease_token = @claim_token::uuid AND e.enabled
), due AS (
    SELECT p.id, p.ordering_key FROM outbox_messages p
    WHERE p.destination = @destination::uuid AND p.status = 'pending' AND NOT p.parked AND p.next_attempt_at <= now()
      AND EXISTS (SELECT 1 FROM lease)
    ORDER BY p.next_attempt_at, p.id
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
), judged AS (
    SELECT d.id,
           d.ordering_key IS NOT NULL AND (
               row_number() OVER (PARTITION BY d.ordering_key ORDER BY d.id) > 1
               OR EXISTS (
                   SELECT 1 FROM outbox_messages b
                   WHERE b.destination = @destination::uuid AND b.ordering_key = d.ordering_key
                     AND (b.status IN ('claimed', 'failed')
                          OR (b.status = 'pending' AND (b.attempts > 0 OR b.attempts_before > 0 OR b.parked)))
                     AND (b.status = 'claimed' OR b.id < d.id))
           ) AS behind
    FROM due d
), parked AS (
    UPDATE outbox_messages m SET parked = true
    WHERE m.id = ANY (ARRAY(SELECT j.id FROM judged j WHERE j.behind))
)
UPDATE outbox_messages m
SET status = 'claimed', claim_token = @claim_token::uuid, claimed_by = @relay_id::uuid, claimed_at = now()
FROM lease, outbox_events ev
WHERE m.id = ANY (ARRAY(SELECT j.id FROM judged j WHERE NOT j.behind)) AND ev.id = m.event_id
RETURNING m.id, m.event_id, m.type, ev.payload, m.attempts, ev.created_at, ev.trace_context, m.ordering_key,
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
-- record harmless. A delivered message with an ordering key promotes the
-- first parked message of its key (see MessageClaim): due again at its own
-- time, so ahead of any newer one of the key. The first, not the first
-- after it: a replayed event parked while the delivered one was in flight
-- comes before it in the key. The endpoint keeps its latest
-- attempt, success and error (what the ops page shows), each replaced only
-- by a later one, and the attempts are added to their minute's sums
-- (outbox_attempt_minutes), in key order so that two recordings cannot
-- deadlock. The releases below repeat that upsert: a function shared by
-- the three cost the relay's small recordings more than the lines it saves
-- (docs/design.md).
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
    -- Its attempt too: the rest joins the outcomes on (id, attempt), so an
    -- outcome recorded already, flushed again beside the message's next,
    -- is neither summed again nor taken for the endpoint's latest.
    RETURNING m.id, m.attempts, m.attempts_before, m.status, m.destination, m.ordering_key
), promoted AS (
    UPDATE outbox_messages n SET parked = false
    FROM held h
    WHERE h.status = 'delivered' AND h.ordering_key IS NOT NULL
      AND n.id = (SELECT w.id FROM outbox_messages w
                  WHERE w.destination = h.destination AND w.ordering_key = h.ordering_key
                    AND w.status = 'pending' AND w.parked
                  ORDER BY w.id LIMIT 1)
), latest AS (
    SELECT h.destination,
           max(o.finished_at) AS attempt_at,
           (array_agg(o.outcome ORDER BY o.finished_at DESC))[1] AS attempt_outcome,
           max(o.finished_at) FILTER (WHERE o.outcome = 'delivered') AS success_at,
           max(o.finished_at) FILTER (WHERE o.outcome <> 'delivered') AS error_at,
           (array_agg(NULLIF(o.status_code, 0) ORDER BY o.finished_at DESC) FILTER (WHERE o.outcome <> 'delivered'))[1]
               AS error_status_code,
           (array_agg(NULLIF(o.last_error, '') ORDER BY o.finished_at DESC) FILTER (WHERE o.outcome <> 'delivered'))[1]
               AS error
    FROM held h JOIN o ON o.id = h.id AND o.attempt = h.attempts
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
    SELECT h.destination, date_trunc('minute', o.finished_at), o.outcome,
           CASE WHEN o.outcome = 'delivered' THEN outbox_latency_bucket_ms(x.ms) ELSE 0 END,
           count(*), min(x.ms), max(x.ms)
    FROM held h
    JOIN o ON o.id = h.id AND o.attempt = h.attempts
    CROSS JOIN LATERAL (SELECT GREATEST(EXTRACT(epoch FROM o.finished_at - o.started_at) * 1000, 0)::float8 AS ms) x
    GROUP BY 1, 2, 3, 4
    ORDER BY 1, 2, 3, 4
    ON CONFLICT (destination, minute, outcome, le_ms) DO UPDATE
    SET attempts = t.attempts + excluded.attempts,
        min_ms = LEAST(t.min_ms, excluded.min_ms),
        max_ms = GREATEST(t.max_ms, excluded.max_ms)
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
SELECT h.id, h.attempts_before + o.attempt, o.outcome, o.started_at, o.finished_at,
       NULLIF(o.status_code, 0), NULLIF(o.last_error, '')
FROM held h JOIN o ON o.id = h.id AND o.attempt = h.attempts
ON CONFLICT DO NOTHING;

-- name: MessagesRelease :execrows
-- Returns claimed messages that were never sent (the job was stopped before
-- their request began) to pending as they were: no attempt is counted and
-- they are due again at once.
UPDATE outbox_messages
SET status = 'pending', claim_token = NULL, claimed_at = NULL, claimed_by = NULL
WHERE id = ANY (@ids::uuid[]) AND claim_token = @claim_token::uuid;

-- name: MessagesReleaseByToken :execrows
-- MessagesRelease for a job that lost track of what it claimed: a claim
-- statement that failed on the way back (the connection dropped after it
-- committed) leaves rows claimed under the job's token that the job never
-- saw. Run at the job's end, after its outcomes are recorded, so whatever
-- is still claimed under its token had no request: it goes back to pending
-- as it was, rather than waiting out the claim timeout and being charged an
-- attempt it never made. Reads the claimed rows (as many as are in flight
-- everywhere), so it runs only after a claim failed.
UPDATE outbox_messages
SET status = 'pending', claim_token = NULL, claimed_at = NULL, claimed_by = NULL
WHERE status = 'claimed' AND claim_token = @claim_token::uuid;

-- name: MessagesReleaseLost :execrows
-- Settles the claims of relays declared dead: their requests were in flight
-- and may have reached the receiver, so each counts as an attempt
-- ("interrupted") and the message is due again at once; at the attempt cap
-- it fails instead (its attempt recorded as 'failed', as any attempt that
-- reaches the cap is), so a message whose delivery kills its relay every time
-- cannot kill relays forever. This is the at-least-once window, by design.
-- Their endpoints' latest attempt and error say so, and their minute's sums
-- count them.
WITH lost AS (
    SELECT id, destination, attempts, attempts_before, claimed_at FROM outbox_messages
    WHERE status = 'claimed' AND claimed_by = ANY (@relay_ids::uuid[])
    FOR UPDATE SKIP LOCKED
), released AS (
    UPDATE outbox_messages m
    SET status = CASE WHEN m.attempts + 1 >= @max_attempts::integer THEN 'failed' ELSE 'pending' END,
        failed_at = CASE WHEN m.attempts + 1 >= @max_attempts::integer THEN now() END,
        attempts = m.attempts + 1,
        claim_token = NULL,
        claimed_at = NULL,
        claimed_by = NULL,
        next_attempt_at = now(),
        last_error = @reason::text
    FROM lost
    WHERE m.id = lost.id
    RETURNING m.id, CASE WHEN m.status = 'failed' THEN 'failed' ELSE 'interrupted' END AS outcome
), endpoint AS (
    UPDATE webhook_endpoints e
    SET last_attempt_at = now(), last_attempt_outcome = 'interrupted',
        last_error_at = now(), last_error_status_code = NULL, last_error = @reason::text
    WHERE e.id IN (SELECT l.destination FROM lost l JOIN released r ON r.id = l.id)
), summed AS (
    INSERT INTO outbox_attempt_minutes AS t (destination, minute, outcome, le_ms, attempts, min_ms, max_ms)
    SELECT l.destination, date_trunc('minute', now()), r.outcome, 0, count(*),
           min(x.ms), max(x.ms)
    FROM lost l
    JOIN released r ON r.id = l.id
    CROSS JOIN LATERAL (SELECT GREATEST(EXTRACT(epoch FROM now() - l.claimed_at) * 1000, 0)::float8 AS ms) x
    GROUP BY 1, 3
    ORDER BY 1, 3
    ON CONFLICT (destination, minute, outcome, le_ms) DO UPDATE
    SET attempts = t.attempts + excluded.attempts,
        min_ms = LEAST(t.min_ms, excluded.min_ms),
        max_ms = GREATEST(t.max_ms, excluded.max_ms)
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, error)
SELECT l.id, l.attempts_before + l.attempts + 1, r.outcome, l.claimed_at, now(), @reason::text
FROM lost l JOIN released r ON r.id = l.id
ON CONFLICT DO NOTHING;

-- name: MessageReleaseStale :execrows
-- The last resort: returns claims older than the claim timeout to pending
-- (or to failed at the attempt cap) and records the lost attempt, whatever
-- their relay. A claim lives as long as its request, so only a relay that is
-- alive but stuck leaves one this old; a dead relay's claims are released
-- within seconds by MessagesReleaseLost. Their endpoints' latest attempt
-- and error say so, and their minute's sums count them.
--
-- A claim is stale after the claim timeout of the relay that made it
-- (outbox_relays), or after @claim_timeout_seconds when that relay is not
-- registered: relays may run with different timeouts during a rollout, and
-- one must not release another's claims while their requests may still be
-- in flight. The shortest timeout of all bounds the scan on the claimed
-- index first.
WITH stale AS (
    SELECT m.id, m.destination, m.attempts, m.attempts_before, m.claimed_at
    FROM outbox_messages m
    LEFT JOIN outbox_relays r ON r.id = m.claimed_by
    WHERE m.status = 'claimed'
      AND m.claimed_at < now() - make_interval(secs => LEAST(@claim_timeout_seconds::float8,
              (SELECT min(a.claim_timeout_seconds) FROM outbox_relays a)))
      AND m.claimed_at < now() - make_interval(secs => COALESCE(r.claim_timeout_seconds, @claim_timeout_seconds::float8))
    FOR UPDATE OF m SKIP LOCKED
), released AS (
    UPDATE outbox_messages m
    SET status = CASE WHEN m.attempts + 1 >= @max_attempts::integer THEN 'failed' ELSE 'pending' END,
        failed_at = CASE WHEN m.attempts + 1 >= @max_attempts::integer THEN now() END,
        attempts = m.attempts + 1,
        claim_token = NULL,
        claimed_at = NULL,
        claimed_by = NULL,
        next_attempt_at = now(),
        last_error = 'claim timed out: the relay did not record an outcome'
    FROM stale
    WHERE m.id = stale.id
    RETURNING m.id, CASE WHEN m.status = 'failed' THEN 'failed' ELSE 'timeout' END AS outcome
), endpoint AS (
    UPDATE webhook_endpoints e
    SET last_attempt_at = now(), last_attempt_outcome = 'timeout',
        last_error_at = now(), last_error_status_code = NULL,
        last_error = 'claim timed out: the relay did not record an outcome'
    WHERE e.id IN (SELECT s.destination FROM stale s JOIN released r ON r.id = s.id)
), summed AS (
    INSERT INTO outbox_attempt_minutes AS t (destination, minute, outcome, le_ms, attempts, min_ms, max_ms)
    SELECT s.destination, date_trunc('minute', now()), r.outcome, 0, count(*),
           min(x.ms), max(x.ms)
    FROM stale s
    JOIN released r ON r.id = s.id
    CROSS JOIN LATERAL (SELECT GREATEST(EXTRACT(epoch FROM now() - s.claimed_at) * 1000, 0)::float8 AS ms) x
    GROUP BY 1, 3
    ORDER BY 1, 3
    ON CONFLICT (destination, minute, outcome, le_ms) DO UPDATE
    SET attempts = t.attempts + excluded.attempts,
        min_ms = LEAST(t.min_ms, excluded.min_ms),
        max_ms = GREATEST(t.max_ms, excluded.max_ms)
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, error)
SELECT s.id, s.attempts_before + s.attempts + 1, r.outcome, s.claimed_at, now(), 'claim timed out: the relay did not record an outcome'
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

-- name: MessagesPruneFailed :execrows
-- Deletes one bounded batch of failed rows that gave up before
-- @failed_before (the failed retention), with their attempts (ON DELETE
-- CASCADE); the caller loops, then prunes the events left without a
-- delivery. Walked by age on the failed_at index. A failed message that held
-- back later messages of its ordering key is gone as if skipped:
-- MessagesPromoteStranded, in the same prune job, lets them go.
DELETE FROM outbox_messages
WHERE id IN (
    SELECT p.id FROM outbox_messages p
    WHERE p.status = 'failed' AND p.failed_at < @failed_before::timestamptz
    ORDER BY p.failed_at
    LIMIT @batch_size
)
-- Again outside the subquery: a row requeued by a person while this
-- statement waited for its lock is re-read here, and kept.
AND status = 'failed' AND failed_at < @failed_before::timestamptz;

-- name: EventsPrune :one
-- Looks at one bounded batch of the events written before @created_before,
-- in id order after the cursor @after, and deletes those no delivery refers
-- to any more; the caller loops after pruning deliveries, from the last id
-- looked at, until a batch looks at fewer than @batch_size. An event lives
-- as long as any of its deliveries, so a failed or pending one keeps its
-- payload; the cursor walks past those, so a run looks at each old event
-- once, however many are kept (a batch that skipped them anew read them
-- all again each time: a paused endpoint's week of backlog, every batch).
-- A delivery's id shares its event's time prefix, so an event's deliveries
-- are a primary-key range: no index on event_id.
WITH scanned AS (
    SELECT o.id FROM outbox_events o
    WHERE o.id < outbox_uuid_at(@created_before::timestamptz) AND o.id > @after::uuid
    ORDER BY o.id
    LIMIT @batch_size::integer
), deleted AS (
    DELETE FROM outbox_events e
    USING scanned s
    WHERE e.id = s.id
      AND NOT EXISTS (
          -- OFFSET 0 keeps this a probe per event: as an anti-join the
          -- planner would hash every message instead.
          SELECT 1 FROM outbox_messages m
          WHERE m.id BETWEEN outbox_uuid_floor(s.id) AND outbox_uuid_ceil(s.id) AND m.event_id = s.id
          OFFSET 0)
    RETURNING 1
)
SELECT (SELECT count(*) FROM scanned) AS scanned,
       (SELECT count(*) FROM deleted) AS deleted,
       COALESCE((SELECT s.id FROM scanned s ORDER BY s.id DESC LIMIT 1), @after::uuid)::uuid AS last_id;

-- name: AttemptMinutesPrune :execrows
-- Forgets one bounded batch of the per-minute sums of attempts older than
-- @before, oldest first (the page reads a day of them); the caller loops.
-- An hour of a thousand busy endpoints is hundreds of thousands of rows:
-- in one statement, seconds of deleting.
DELETE FROM outbox_attempt_minutes t
USING (SELECT o.destination, o.minute, o.outcome, o.le_ms FROM outbox_attempt_minutes o
       WHERE o.minute < @before::timestamptz
       ORDER BY o.minute
       LIMIT @batch_size::integer) old
WHERE t.destination = old.destination AND t.minute = old.minute AND t.outcome = old.outcome AND t.le_ms = old.le_ms;

-- name: MessagesPromoteStranded :execrows
-- The safety net of per-key order, for one destination: promotes parked
-- messages (see MessageClaim) that nothing earlier of their key holds back
-- any more, such as one a claim parked while a person skipped the message
-- ahead of it (the skip's promotion could not see it yet). Promoting one
-- that still has to wait is harmless: the next claim parks it again. A
-- deliver job runs it as it ends, at most once every 10 s per destination
-- and process (it reads every parked message of the destination), and the
-- prune job for every endpoint; with nothing parked it is one probe of
-- outbox_messages_ordering_idx.
UPDATE outbox_messages m
SET parked = false
WHERE m.id IN (
    SELECT DISTINCT ON (w.ordering_key) w.id
    FROM outbox_messages w
    WHERE w.destination = @destination::uuid AND w.ordering_key IS NOT NULL
      AND w.status = 'pending' AND w.parked
    ORDER BY w.ordering_key, w.id
)
AND NOT EXISTS (
    SELECT 1 FROM outbox_messages b
    WHERE b.destination = m.destination AND b.ordering_key = m.ordering_key
      AND (b.status IN ('claimed', 'failed')
           OR (b.status = 'pending' AND (b.attempts > 0 OR b.attempts_before > 0 OR b.parked)))
      AND (b.status = 'claimed' OR b.id < m.id));

-- name: MessagesPromoteKeys :execrows
-- MessagesPromoteStranded for some keys only, at once: run by a deliver job
-- after a recording that ran beside one of its claims. The claim may have
-- parked a message behind one the recording settled, and the recording's
-- promotion, which could not see the park yet, let nothing go: the message
-- would wait for the job's end. One probe of outbox_messages_ordering_idx
-- per key.
UPDATE outbox_messages m
SET parked = false
WHERE m.id IN (
    SELECT f.id
    FROM unnest(@keys::text[]) AS k (key)
    CROSS JOIN LATERAL (
        SELECT w.id FROM outbox_messages w
        WHERE w.destination = @destination::uuid AND w.ordering_key = k.key
          AND w.status = 'pending' AND w.parked
        ORDER BY w.id
        LIMIT 1
    ) f
)
AND NOT EXISTS (
    SELECT 1 FROM outbox_messages b
    WHERE b.destination = m.destination AND b.ordering_key = m.ordering_key
      AND (b.status IN ('claimed', 'failed')
           OR (b.status = 'pending' AND (b.attempts > 0 OR b.attempts_before > 0 OR b.parked)))
      AND (b.status = 'claimed' OR b.id < m.id));

-- name: MessagesDiscardOrphans :execrows
-- Discards up to @batch_size pending or failed messages whose endpoint no
-- longer exists: what a deletion left to the relay (more than it could
-- settle while its request waits), and rows an order transaction wrote
-- while their endpoint was being deleted, which the deletion's own discard
-- could not see. Skip scans find the destinations with messages left, one
-- index probe each: on the pending index; on the ordering index (its own
-- predicate, so any entry answers) for those parked behind an earlier
-- message of their key, which a deleted endpoint may have alone when its
-- deletion discarded the failed heads of their keys and ran out of time;
-- and on the failed-by-destination index for failed ones, which would
-- otherwise count as failed, and alert, until their retention ends. The
-- caller loops.
WITH RECURSIVE heads AS (
    (SELECT destination FROM outbox_messages
     WHERE status = 'pending' AND NOT parked ORDER BY destination LIMIT 1)
    UNION ALL
    SELECT n.destination
    FROM heads h, LATERAL (
        SELECT m.destination FROM outbox_messages m
        WHERE m.status = 'pending' AND NOT m.parked AND m.destination > h.destination
        ORDER BY m.destination LIMIT 1
    ) n
), keyed_heads AS (
    (SELECT destination FROM outbox_messages
     WHERE ordering_key IS NOT NULL
       AND (status IN ('claimed', 'failed') OR status = 'pending' AND (attempts > 0 OR attempts_before > 0 OR parked))
     ORDER BY destination LIMIT 1)
    UNION ALL
    SELECT n.destination
    FROM keyed_heads h, LATERAL (
        SELECT m.destination FROM outbox_messages m
        WHERE m.ordering_key IS NOT NULL
          AND (m.status IN ('claimed', 'failed') OR m.status = 'pending' AND (m.attempts > 0 OR m.attempts_before > 0 OR m.parked))
          AND m.destination > h.destination
        ORDER BY m.destination LIMIT 1
    ) n
), failed_heads AS (
    (SELECT destination FROM outbox_messages
     WHERE status = 'failed' ORDER BY destination LIMIT 1)
    UNION ALL
    SELECT n.destination
    FROM failed_heads h, LATERAL (
        SELECT m.destination FROM outbox_messages m
        WHERE m.status = 'failed' AND m.destination > h.destination
        ORDER BY m.destination LIMIT 1
    ) n
), orphans AS (
    SELECT d.destination
    FROM (SELECT destination FROM heads UNION SELECT destination FROM keyed_heads
          UNION SELECT destination FROM failed_heads) d
    WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.destination)
)
UPDATE outbox_messages m
SET status = 'discarded', discarded_at = now(), last_error = 'endpoint deleted', parked = false
WHERE m.id IN (
    -- Per orphan destination, index probes (a join could hash every
    -- pending message instead); failed, then parked ones first, as a
    -- deletion does.
    SELECT u.id
    FROM orphans o, LATERAL (
        (SELECT f.id FROM outbox_messages f
         WHERE f.destination = o.destination AND f.status = 'failed'
         LIMIT @batch_size)
        UNION ALL
        (SELECT w.id FROM outbox_messages w
         WHERE w.destination = o.destination AND w.ordering_key IS NOT NULL AND w.status = 'pending' AND w.parked
         LIMIT @batch_size)
        UNION ALL
        (SELECT p.id FROM outbox_messages p
         WHERE p.destination = o.destination AND p.status = 'pending' AND NOT p.parked
         LIMIT @batch_size)
    ) u
    LIMIT @batch_size
)
-- Again outside the subquery: a row a deletion's batch discarded while
-- this statement waited for its lock is re-read here, and left alone.
AND m.status IN ('failed', 'pending');

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
-- from @events_from to @events_to. Event ids begin with their time, so the
-- window is a range of the events' primary key, read newest first and
-- filtered by key; each event's deliveries come from the deliveries'
-- primary key, whose ids share the event's time prefix. There is no index
-- on the key (the order transaction would maintain it): the cost follows
-- the window, which the caller keeps narrow (a module knows when its
-- entity's events were written).
SELECT m.id, m.event_id, m.type, m.destination, m.status, m.attempts,
       m.parked, m.next_attempt_at,
       m.claimed_at, m.delivered_at, m.discarded_at, m.last_error, m.created_at, m.ordering_key,
       ev.created_at AS event_created_at, ev.payload
FROM outbox_events ev
JOIN outbox_messages m ON m.id BETWEEN outbox_uuid_floor(ev.id) AND outbox_uuid_ceil(ev.id) AND m.event_id = ev.id
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
-- it is due from the later of its own next attempt and the end of its
-- endpoint's backoff (a parked message is not due). A healthy relay keeps this near the poll interval,
-- whatever waits for paused or failing endpoints. One index probe per
-- destination with pending messages (a skip scan), never a scan of them all.
WITH RECURSIVE heads AS (
    (SELECT destination, next_attempt_at FROM outbox_messages
     WHERE status = 'pending' AND NOT parked ORDER BY destination, next_attempt_at LIMIT 1)
    UNION ALL
    SELECT n.destination, n.next_attempt_at
    FROM heads h, LATERAL (
        SELECT m.destination, m.next_attempt_at FROM outbox_messages m
        WHERE m.status = 'pending' AND NOT m.parked AND m.destination > h.destination
        ORDER BY m.destination, m.next_attempt_at LIMIT 1
    ) n
)
SELECT COALESCE(EXTRACT(epoch FROM now() - min(GREATEST(h.next_attempt_at, e.backoff_until))), 0)::float8
FROM heads h
JOIN webhook_endpoints e ON e.id = h.destination
WHERE e.enabled AND GREATEST(h.next_attempt_at, e.backoff_until) <= now();

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
-- sent, and the next message of its ordering key, parked behind it, is due
-- again (MessagePromoteNext, in the same transaction). A claim that read
-- the message as failed before the commit may park the next one where this
-- transaction cannot see it: MessagesPromoteKeys after the commit promotes
-- it, or the claim's job as it ends (MessagesPromoteStranded).
UPDATE outbox_messages
SET status = 'discarded', discarded_at = now(), last_error = @reason::text
WHERE id = @id AND status = 'failed'
RETURNING id, destination, ordering_key;

-- name: MessagePromoteNext :execrows
-- Promotes the first message parked behind @id in its destination and
-- ordering key: due again at its own time.
UPDATE outbox_messages n SET parked = false
WHERE n.id = (SELECT w.id FROM outbox_messages w
              WHERE w.destination = @destination::uuid AND w.ordering_key = @ordering_key::text AND w.id > @id::uuid
                AND w.status = 'pending' AND w.parked
              ORDER BY w.id LIMIT 1);

-- name: MessagesDiscardForDestination :execrows
-- Settles up to @batch_size undelivered messages of an endpoint being
-- deleted: they will never be sent. The deletion runs it in its own
-- transaction, then in batches of their own (a day's backlog is millions of
-- rows, minutes of writing). Claimed ones lose their claim, so the job
-- sending them records nothing. Each status is found on its own partial
-- index, never by scanning the delivered history.
UPDATE outbox_messages
SET status = 'discarded', discarded_at = now(), last_error = @reason::text,
    claim_token = NULL, claimed_at = NULL, claimed_by = NULL, parked = false
WHERE id IN (
    -- Claimed and failed first: what a deletion leaves to the relay is
    -- pending, which MessagesDiscardOrphans settles.
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
)
-- Again outside the subquery: a message the relay recorded delivered
-- while this statement waited for its lock is re-read here, and kept.
AND status IN ('claimed', 'failed', 'pending');

-- name: MessageKeyHead :one
-- What a parked message waits for: the earliest unfinished message of its
-- destination and ordering key before it, or the one of its key in flight
-- (a replayed event waits for it; on the ordering index). None
-- means it waits only to be promoted (MessagesPromoteStranded).
SELECT b.id, b.status FROM outbox_messages b
WHERE b.destination = @destination::uuid AND b.ordering_key = @ordering_key::text
  AND (b.status IN ('claimed', 'failed')
       OR (b.status = 'pending' AND (b.attempts > 0 OR b.attempts_before > 0 OR b.parked)))
  AND (b.status = 'claimed' OR b.id < @id::uuid)
ORDER BY b.id
LIMIT 1;

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
JOIN outbox_messages m ON m.id BETWEEN outbox_uuid_floor(ev.id) AND outbox_uuid_ceil(ev.id) AND m.event_id = ev.id
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
