-- Dispatch and the lease: which destinations have work, and the lease that
-- lets one deliver job at a time serve a destination.

-- name: DestinationsDispatch :many
-- Finds destinations with due messages that no live job serves, marks them
-- dispatched and returns them; the caller inserts one deliver job for each
-- in the same transaction. Finding them is a skip scan of the pending index
-- (one probe per destination with pending messages, whatever the backlog or
-- history) joined to the endpoints: enabled, not backing off (or due for a
-- probe), not leased by a live relay (alive by its own timeout, as
-- everywhere: a lease lasts as long as its relay lives), and not dispatched
-- in the last @redispatch_after_seconds (a job already waits for it). SKIP
-- LOCKED lets every worker run this at once without waiting on one another.
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
), ready AS (
    SELECT e.id FROM heads h
    JOIN webhook_endpoints e ON e.id = h.destination
    WHERE h.next_attempt_at <= now()
      AND e.enabled
      AND (e.backoff_until IS NULL OR e.backoff_until <= now())
      AND (e.dispatched_at IS NULL
           OR e.dispatched_at < now() - make_interval(secs => @redispatch_after_seconds::float8))
      AND NOT EXISTS (
          SELECT 1 FROM outbox_relays r
          WHERE r.id = e.lease_relay
            AND r.heartbeat_at >= now() - make_interval(secs => r.timeout_seconds))
    ORDER BY GREATEST(h.next_attempt_at, e.backoff_until)
    LIMIT @max_destinations
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE webhook_endpoints e SET dispatched_at = now()
FROM ready
WHERE e.id = ready.id
RETURNING e.id;

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
