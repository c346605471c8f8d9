-- Dispatch and the lease: which destinations have work, and the lease that
-- lets one deliver job at a time serve a destination.

-- name: DestinationsDispatch :one
-- Finds destinations with due messages that no live job serves, below the
-- destination @below (the caller goes round them all, poll after poll,
-- from the greatest id down), as many as @workers less the deliver jobs
-- already waiting for a worker in any relay (waiting, returned), marks
-- them dispatched and returns them (ids); the caller then inserts one
-- deliver job for each. One statement, one round trip: an idle relay runs
-- it every poll interval.
--
-- The candidates are the endpoints whose backoff is over (found by time),
-- then the servable endpoints with pending messages, found by walking two
-- indexes side by side: from a destination with pending messages, the
-- first servable endpoint at or below it; if it is that destination, a
-- candidate; either way, the next destination with pending messages at or
-- below that endpoint. Each step passes at least one row of each index, so
-- a poll costs at most twice the smaller of the two sets: not one probe per
-- destination with a backlog when thousands are down and backing off, nor
-- one per endpoint when thousands are idle. A candidate is dispatched when
-- a pending message of it is due, it is not leased by a live relay (alive
-- by its own timeout, as everywhere), and it was not dispatched in the
-- last @redispatch_after_seconds, or was but its job no longer waits (lost
-- with a relay that fetched it, or that died before inserting it). SKIP
-- LOCKED lets every worker run this at once without waiting on one another.
--
-- Both index reads go down the pending index (destination, next_attempt_at,
-- id), from a destination's newest entries. A destination draining a
-- backlog leaves the entries of what it delivered at the start of its
-- range, dead until a vacuum removes them; a read from the start walks
-- them all, a page for every hundred or so delivered, and went on growing
-- with the drain (to 1,400 pages, 2-4 ms a poll, at the end of 200,000
-- messages): every relay paid it every poll interval, while the one
-- serving the destination claimed.
WITH RECURSIVE waiting AS (
    SELECT count(*)::integer AS n FROM river_job j WHERE j.state = 'available' AND j.queue = 'outbox_deliver'
), walk AS (
    (SELECT p.destination AS d,
            (SELECT s.id FROM webhook_endpoints s
             WHERE s.enabled AND s.backoff_until IS NULL AND s.id <= p.destination
             ORDER BY s.id DESC LIMIT 1) AS s
     FROM outbox_messages p
     WHERE p.status = 'pending' AND NOT p.parked AND p.destination < @below::uuid
     ORDER BY p.destination DESC LIMIT 1)
    UNION ALL
    SELECT n.d,
           (SELECT s.id FROM webhook_endpoints s
            WHERE s.enabled AND s.backoff_until IS NULL AND s.id <= n.d
            ORDER BY s.id DESC LIMIT 1)
    FROM walk w, LATERAL (
        SELECT p.destination AS d FROM outbox_messages p
        WHERE p.status = 'pending' AND NOT p.parked AND p.destination < w.d AND p.destination <= w.s
        ORDER BY p.destination DESC LIMIT 1
    ) n
    WHERE w.s IS NOT NULL
), candidates AS (
    SELECT b.id FROM webhook_endpoints b
    WHERE b.enabled AND b.backoff_until IS NOT NULL AND b.backoff_until <= now()
    UNION ALL
    SELECT w.d FROM walk w WHERE w.d = w.s
), ready AS (
    SELECT e.id FROM candidates c
    JOIN webhook_endpoints e ON e.id = c.id
    -- A due pending message: the newest one, read down the pending index
    -- from now (due means its oldest is; an EXISTS may be planned as a scan
    -- of the table, every delivered row of the destination read on the way).
    JOIN LATERAL (
        SELECT 1 FROM outbox_messages m
        WHERE m.destination = e.id AND m.status = 'pending' AND NOT m.parked AND m.next_attempt_at <= now()
        ORDER BY m.next_attempt_at DESC LIMIT 1
    ) h ON true
    WHERE (e.dispatched_at IS NULL
           OR e.dispatched_at < now() - make_interval(secs => @redispatch_after_seconds::float8)
              AND NOT EXISTS (
                  SELECT 1 FROM river_job j
                  WHERE j.state = 'available' AND j.queue = 'outbox_deliver'
                    AND j.args->>'destination' = e.id::text))
      AND NOT EXISTS (
          SELECT 1 FROM outbox_relays r
          WHERE r.id = e.lease_relay
            AND r.heartbeat_at >= now() - make_interval(secs => r.timeout_seconds))
    LIMIT greatest(sqlc.arg(workers)::integer - (SELECT w.n FROM waiting w), 0)
    FOR UPDATE OF e SKIP LOCKED
), dispatched AS (
    UPDATE webhook_endpoints e SET dispatched_at = now()
    FROM ready
    WHERE e.id = ready.id
    RETURNING e.id
)
SELECT (SELECT w.n FROM waiting w) AS waiting,
       ARRAY(SELECT d.id FROM dispatched d)::uuid[] AS ids;

-- name: DestinationLease :one
-- A deliver job takes the destination's lease, unless a live relay's job
-- holds it (then no row: the job has nothing to do), and reads the
-- destination's health and pace. The lease is a token on the endpoint row,
-- valid while its relay is alive. The caller takes the destination's lock
-- first (DestinationLock): a takeover from a relay declared dead while it
-- still ran waits for that relay's claim in progress, and any later claim
-- of it finds the token changed (MessageClaim). Concurrent takers
-- serialise on the lock; the loser finds the lease held.
UPDATE webhook_endpoints e
SET lease_token = @lease_token::uuid, lease_relay = @relay_id::uuid, dispatched_at = NULL
WHERE e.id = @id AND e.enabled
  AND (e.backoff_until IS NULL OR e.backoff_until <= now())
  AND NOT EXISTS (
      SELECT 1 FROM outbox_relays r
      WHERE r.id = e.lease_relay
        AND r.heartbeat_at >= now() - make_interval(secs => r.timeout_seconds))
RETURNING e.url, e.health, e.health_reason, e.health_changed_at, e.consecutive_failures, e.backoff_until, e.pace;

-- name: DestinationLeaseRelease :exec
-- Gives up a lease whose taking failed as far as the job could tell: the
-- update may have committed with its answer lost, and nothing else would
-- free a lease held by a live relay.
UPDATE webhook_endpoints SET lease_token = NULL, lease_relay = NULL
WHERE id = @id AND lease_token = @lease_token::uuid;

-- name: DestinationUndispatch :exec
-- A relay that is stopping hands back a job it fetched but will not run:
-- the next poll of any relay dispatches the destination again at once.
UPDATE webhook_endpoints SET dispatched_at = NULL WHERE id = @id AND lease_token IS NULL;
