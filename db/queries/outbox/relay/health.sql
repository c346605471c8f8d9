-- A destination's health and pace, as a deliver job leaves it.

-- name: DestinationSettle :one
-- Ends a job's lease and stores the destination's health and pace as the
-- job leaves it: healthy or backing off, its failure streak, when it may be
-- served again (the next probe, or the end of a Retry-After), and how many
-- requests the next job may start with (NULL: start low). A 410 Gone
-- pauses the endpoint. All of it only while the endpoint still names the
-- @url the job served: a person who moved it to another destination
-- meanwhile reset its health (EndpointUpdate), and what the old one
-- answered says nothing of the new. due says work remains that the
-- destination may be served now (it is enabled and not backing off, as
-- the update left it): the caller wakes the dispatch, which queues the
-- next job behind those already waiting (the dispatch is the one place
-- deliver jobs are made).
UPDATE webhook_endpoints e
SET lease_token = NULL,
    lease_relay = NULL,
    health = CASE WHEN e.url = @url::text THEN @health::text ELSE e.health END,
    health_reason = CASE WHEN e.url = @url::text THEN sqlc.narg(health_reason) ELSE e.health_reason END,
    health_changed_at = CASE WHEN e.url = @url::text AND e.health <> @health::text THEN now() ELSE e.health_changed_at END,
    consecutive_failures = CASE WHEN e.url = @url::text THEN @consecutive_failures ELSE e.consecutive_failures END,
    backoff_until = CASE WHEN e.url = @url::text THEN sqlc.narg(backoff_until) ELSE e.backoff_until END,
    pace = CASE WHEN e.url = @url::text THEN sqlc.narg(pace)::integer ELSE e.pace END,
    enabled = e.enabled AND NOT (@gone::boolean AND e.url = @url::text),
    disabled_reason = CASE WHEN @gone::boolean AND e.url = @url::text AND e.enabled THEN 'receiver answered 410 Gone' ELSE e.disabled_reason END,
    disabled_at = CASE WHEN @gone::boolean AND e.url = @url::text AND e.enabled THEN now() ELSE e.disabled_at END,
    updated_at = CASE WHEN @gone::boolean AND e.url = @url::text AND e.enabled THEN now() ELSE e.updated_at END
WHERE e.id = @id AND e.lease_token = @lease_token::uuid
RETURNING (e.enabled AND e.backoff_until IS NULL
           AND EXISTS (SELECT 1 FROM outbox_messages m
                       WHERE m.destination = e.id AND m.status = 'pending' AND NOT m.parked AND m.next_attempt_at <= now())
          )::boolean AS due;

-- name: DestinationHealthy :exec
-- Marks a destination healthy again, after MessagesBringForward. Its pace
-- starts low again (NULL): a receiver back from an outage is not sent its
-- whole backlog at once.
UPDATE webhook_endpoints
SET health = 'healthy', health_reason = NULL, health_changed_at = now(),
    consecutive_failures = 0, backoff_until = NULL, pace = NULL
WHERE id = @destination::uuid AND lease_token = @lease_token::uuid;

-- name: MessagesBringForward :execrows
-- A probe got an answer: the destination is healthy again (the caller then
-- runs DestinationHealthy in the same transaction). Its messages that the
-- outage sent into a later retry (the probes, and the failures that opened
-- the circuit: their latest attempt was refused, timed out, or got an
-- endpoint-wide answer, as endpointWide in outcome.go judges it: 401, 403,
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
