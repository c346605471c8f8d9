-- Retention: settled rows deleted after their retention, in bounded
-- batches, and the messages of deleted endpoints settled.

-- name: MessagesPrune :one
-- Deletes one bounded batch of settled rows (delivered or discarded) older
-- than the retention, with their attempts, among the ids before
-- @kept_before only: the partitions past their retention that a pending,
-- claimed or failed message keeps (PartitionHeld). Newer rows are not
-- deleted one by one: their partition is dropped whole once it is past its
-- retention. The caller loops. Pending, claimed and failed rows are never
-- touched. Each status is walked by age on its own partial index.
WITH gone AS (
    DELETE FROM outbox_messages
    WHERE id IN (
        (SELECT p.id FROM outbox_messages p
         WHERE p.status = 'delivered' AND p.delivered_at < @settled_before::timestamptz AND p.id < @kept_before::uuid
         ORDER BY p.delivered_at
         LIMIT @batch_size)
        UNION ALL
        (SELECT p.id FROM outbox_messages p
         WHERE p.status = 'discarded' AND p.discarded_at < @settled_before::timestamptz AND p.id < @kept_before::uuid
         ORDER BY p.discarded_at
         LIMIT @batch_size)
    )
    RETURNING id
), attempts AS (
    DELETE FROM outbox_attempts a WHERE a.message_id IN (SELECT g.id FROM gone g)
)
SELECT count(*) FROM gone;

-- name: FailedExpiredDestinations :many
-- The destinations with failed messages that gave up before @failed_before
-- (the failed retention), on the failed_at index.
SELECT DISTINCT destination FROM outbox_messages
WHERE status = 'failed' AND failed_at < @failed_before::timestamptz;

-- name: MessagesPruneFailed :many
-- Deletes one bounded batch of one destination's failed rows that gave up
-- before @failed_before, with their attempts, under the
-- destination's lock (DestinationLock); the caller loops, promotes the
-- returned keys (a failed message that held back later messages of its
-- key is gone as if skipped), then prunes the events left without a
-- delivery. On the failed-by-destination index.
WITH gone AS (
    DELETE FROM outbox_messages
    WHERE id IN (
        SELECT p.id FROM outbox_messages p
        WHERE p.destination = @destination::uuid AND p.status = 'failed' AND p.failed_at < @failed_before::timestamptz
        LIMIT @batch_size
    )
    -- Again outside the subquery: a row requeued by a person while this
    -- statement waited for its lock is re-read here, and kept.
    AND status = 'failed' AND failed_at < @failed_before::timestamptz
    RETURNING id, ordering_key
), attempts AS (
    DELETE FROM outbox_attempts a WHERE a.message_id IN (SELECT g.id FROM gone g)
)
SELECT g.ordering_key FROM gone g;

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

-- name: EventsLockPrune :exec
SELECT pg_advisory_xact_lock(1869574764, 0);

-- name: DeliveryLagMinutesPrune :execrows
-- Forgets one bounded batch of the per-minute lag sums older than @before,
-- oldest first, as AttemptMinutesPrune does for the attempts'.
DELETE FROM outbox_delivery_lag_minutes t
USING (SELECT o.destination, o.minute, o.le_ms FROM outbox_delivery_lag_minutes o
       WHERE o.minute < @before::timestamptz
       ORDER BY o.minute
       LIMIT @batch_size::integer) old
WHERE t.destination = old.destination AND t.minute = old.minute AND t.le_ms = old.le_ms;
