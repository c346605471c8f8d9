-- Queries of the relay's scheduling: which relays are alive, which
-- destinations have work, and the lease that lets one deliver job at a time
-- serve a destination.

-- name: RelayRegister :one
-- Registers a relay process, or brings back one that was declared dead
-- while it lived (a long pause, a lost connection). Returns the database's
-- clock, as RelayHeartbeat does.
INSERT INTO outbox_relays (id, hostname, pid, timeout_seconds, claim_timeout_seconds)
VALUES (@id, @hostname, @pid, @timeout_seconds, @claim_timeout_seconds::float8)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
RETURNING now()::timestamptz AS db_now;

-- name: RelayHeartbeat :one
-- No row (pgx.ErrNoRows) means another relay declared this one dead and
-- released its work. @last_claim_at is the relay's latest claim (NULL
-- before its first), on the database's clock; it only moves forward.
-- Returns the database's clock, which the relay keeps its own against: the
-- times it writes (backoffs, attempts, prune cutoffs) are compared with
-- now() by other processes, and a worker's clock may be off.
UPDATE outbox_relays
SET heartbeat_at = now(), last_claim_at = GREATEST(last_claim_at, sqlc.narg(last_claim_at))
WHERE id = @id
RETURNING now()::timestamptz AS db_now;

-- name: RelayUnregister :exec
DELETE FROM outbox_relays WHERE id = @id;

-- name: RelaysDeclareDead :many
-- Removes the relays whose heartbeat is older than their relay timeout and
-- returns them; the caller releases their claims and leases in the same
-- transaction. Concurrent callers each get a relay once: DELETE locks it.
-- Each relay is judged by the timeout it registered with, which paces its
-- heartbeat, not by the caller's: during a rolling change of
-- OUTBOX_RELAY_TIMEOUT a relay with a short one would otherwise declare the
-- others dead between their beats and take their work while they send.
DELETE FROM outbox_relays
WHERE heartbeat_at < now() - make_interval(secs => timeout_seconds)
RETURNING id;

-- name: RelaysList :many
-- Every registered relay, and whether it is alive: its heartbeat is younger
-- than its own relay timeout. A killed relay's row stays until another relay
-- reaps it, so with none left it is here, silent.
-- now is the database's clock, which every time here was read from.
SELECT id, hostname, pid, started_at, heartbeat_at, last_claim_at, timeout_seconds,
       (heartbeat_at >= now() - make_interval(secs => timeout_seconds))::boolean AS alive,
       now()::timestamptz AS now
FROM outbox_relays
ORDER BY started_at, id;

-- name: DestinationsDispatch :many
-- Finds destinations with due messages that no live job serves, marks them
-- dispatched and returns them; the caller inserts one deliver job for each
-- in the same transaction. Finding them is a skip scan of the pending index
-- (one probe per destination with pending messages, whatever the backlog or
-- history) joined to the endpoints: enabled, not backing off (or due for a
-- probe), not leased by a live relay (alive by its own timeout, as in
-- RelaysDeclareDead), and not dispatched in the last
-- @redispatch_after_seconds (a job already waits for it). SKIP LOCKED lets
-- every worker run this at once without waiting on one another.
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
-- destination's health. Concurrent takers serialise on the row; the loser
-- re-checks and finds it held.
UPDATE webhook_endpoints e
SET lease_token = @lease_token::uuid, lease_relay = @relay_id::uuid, dispatched_at = NULL
WHERE e.id = @id AND e.enabled
  AND (e.backoff_until IS NULL OR e.backoff_until <= now())
  AND NOT EXISTS (
      SELECT 1 FROM outbox_relays r
      WHERE r.id = e.lease_relay
        AND r.heartbeat_at >= now() - make_interval(secs => r.timeout_seconds))
RETURNING e.url, e.health, e.health_reason, e.health_changed_at, e.consecutive_failures, e.backoff_until;

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

-- name: MessagesBringForward :execrows
-- A probe got an answer: the destination is healthy again (the caller then
-- runs DestinationHealthy in the same transaction). Its messages that the
-- outage sent into a later retry (the probes, and the failures that opened
-- the circuit: their latest attempt was refused, timed out, or got an
-- endpoint-wide answer, as endpointWide in deliver.go judges it: 401, 403,
-- 404, 405, 408, 429, 5xx) are due now, instead of waiting out a schedule
-- that grew through the outage (hours, after a long one), each holding its
-- ordering key meanwhile. A message the receiver refused on its own (any
-- other answer, or a broker's refusal of this message alone, recorded
-- 'refused') keeps its schedule. Returns how many were brought forward:
-- few, as the outage's other messages waited without an attempt. Reads
-- only the destination's messages due later (on the pending index) and
-- each one's latest attempt (on the attempts' primary key). It locks the
-- messages before the endpoint, as a deletion does (MessagesDiscard-
-- ForDestination, then EndpointDelete) and a job's end (outcomes, then
-- DestinationSettle): the other order deadlocked with a deletion. The
-- lease is read, not locked: only its holder gives it up.
UPDATE outbox_messages m
SET next_attempt_at = now()
WHERE m.destination = @destination::uuid AND m.status = 'pending' AND NOT m.parked
  AND m.next_attempt_at > now() AND m.attempts > 0
  AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = @destination::uuid AND e.lease_token = @lease_token::uuid)
  AND EXISTS (
      SELECT 1 FROM outbox_attempts a
      WHERE a.message_id = m.id AND a.attempt = m.attempts_before + m.attempts
        AND a.outcome = 'retry'
        AND (a.status_code IS NULL OR a.status_code IN (401, 403, 404, 405, 408, 429) OR a.status_code >= 500));

-- name: DestinationHealthy :exec
-- Marks a destination healthy again, after MessagesBringForward.
UPDATE webhook_endpoints
SET health = 'healthy', health_reason = NULL, health_changed_at = now(),
    consecutive_failures = 0, backoff_until = NULL
WHERE id = @destination::uuid AND lease_token = @lease_token::uuid;

-- name: DestinationSettle :one
-- Ends a job's lease and stores the destination's health as the job leaves
-- it: healthy or backing off, its failure streak, and when it may be served
-- again (the next probe, or the end of a Retry-After). A 410 Gone pauses the
-- endpoint. When due work remains and the destination may be served now, it
-- is marked dispatched again and redispatch is true: the caller inserts the
-- next job in this transaction, so a busy destination goes to the back of
-- the queue without waiting for a poll.
UPDATE webhook_endpoints e
SET lease_token = NULL,
    lease_relay = NULL,
    health = @health::text,
    health_reason = sqlc.narg(health_reason),
    health_changed_at = CASE WHEN e.health <> @health::text THEN now() ELSE e.health_changed_at END,
    consecutive_failures = @consecutive_failures,
    backoff_until = sqlc.narg(backoff_until),
    enabled = e.enabled AND NOT @gone::boolean,
    disabled_reason = CASE WHEN @gone::boolean AND e.enabled THEN 'receiver answered 410 Gone' ELSE e.disabled_reason END,
    disabled_at = CASE WHEN @gone::boolean AND e.enabled THEN now() ELSE e.disabled_at END,
    updated_at = CASE WHEN @gone::boolean AND e.enabled THEN now() ELSE e.updated_at END,
    dispatched_at = CASE
        WHEN e.enabled AND NOT @gone::boolean AND sqlc.narg(backoff_until)::timestamptz IS NULL
             AND EXISTS (SELECT 1 FROM outbox_messages m
                         WHERE m.destination = e.id AND m.status = 'pending' AND NOT m.parked AND m.next_attempt_at <= now())
        THEN now() END
WHERE e.id = @id AND e.lease_token = @lease_token::uuid
RETURNING (e.dispatched_at IS NOT NULL)::boolean AS redispatch;

-- name: DestinationsReleaseLeases :exec
-- Frees the leases of relays that are gone.
UPDATE webhook_endpoints
SET lease_token = NULL, lease_relay = NULL
WHERE lease_relay = ANY (@relay_ids::uuid[]);

-- name: RelaysCount :one
-- The live relays (see RelaysList).
SELECT count(*) FROM outbox_relays
WHERE heartbeat_at >= now() - make_interval(secs => timeout_seconds);

-- name: TransactionPlanGeneric :exec
-- Makes the statements after it in the same transaction (or the same pgx
-- batch, which is one) run under a generic plan, planned once per
-- connection instead of at every call; see MessageClaim.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);
