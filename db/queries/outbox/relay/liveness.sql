-- Liveness PostgreSQL can see: each relay registers and heartbeats, and
-- is alive while its heartbeat is younger than its own relay timeout.

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
-- A relay leaves at a graceful stop: whatever it still claims is lost from
-- now on (recovery.sql), its leases free.
DELETE FROM outbox_relays WHERE id = @id;

-- name: RelaysDeclareDead :many
-- Removes the relays whose heartbeat is older than their relay timeout and
-- returns them, to be said once (concurrent callers each get a relay once:
-- DELETE locks it). Nothing else depends on it: a dead relay's leases are
-- free and its claims lost by the liveness rule itself (recovery.sql), row
-- or no row.
-- Each relay is judged by the timeout it registered with, which paces its
-- heartbeat, not by the caller's: during a rolling change of
-- OUTBOX_RELAY_TIMEOUT a relay with a short one would otherwise declare the
-- others dead between their beats and take their work while they send.
DELETE FROM outbox_relays
WHERE heartbeat_at < now() - make_interval(secs => timeout_seconds)
RETURNING id;
