-- Recovery: claims whose relay can no longer record them go back to work.
--
-- A claim is lost when the relay that made it is not alive (no row in
-- outbox_relays, or a heartbeat older than that relay's own timeout), or
-- when it is older than that relay's claim timeout: a claim lives as long
-- as its request, so only a dead relay, or one alive but stuck, leaves
-- one. A relay stops its requests before its heartbeat can be judged stale
-- (liveness.go), so a claim judged lost has no request in flight. The
-- rule is the same for every relay, whatever it knows of the others: a
-- killed worker's claims, those a graceful stop could not record, and
-- those of a relay declared dead that comes back, all follow it.

-- name: ClaimsLostDestinations :many
-- The destinations holding lost claims. Reads the claimed index only: the
-- messages in flight, however many wait or are kept for the retention.
SELECT DISTINCT m.destination
FROM outbox_messages m
LEFT JOIN outbox_relays r ON r.id = m.claimed_by
WHERE m.status = 'claimed'
  AND (r.id IS NULL
       OR r.heartbeat_at < now() - make_interval(secs => r.timeout_seconds)
       OR m.claimed_at < now() - make_interval(secs => r.claim_timeout_seconds));

-- name: MessagesReleaseLost :many
-- Settles one destination's lost claims, under its lock (DestinationLock;
-- the caller promotes the returned keys after it). Their requests may have
-- reached the receiver, so each counts as an attempt: 'interrupted' when
-- its relay is gone, 'timeout' when it outlived the claim timeout; the
-- message is due again at once, and at the attempt cap it fails instead
-- (its attempt recorded as 'failed', as any attempt that reaches the cap
-- is), so a message whose delivery kills its relay every time cannot kill
-- relays forever. This is the at-least-once window, by design. The
-- endpoint's latest attempt and error say so, and the minute's sums count
-- them. SKIP LOCKED: a row locked by anyone is left for the next pass.
WITH lost AS (
    SELECT m.id, m.destination, m.attempts, m.attempts_before, m.claimed_at, m.ordering_key,
           (r.id IS NULL OR r.heartbeat_at < now() - make_interval(secs => r.timeout_seconds)) AS relay_gone
    FROM outbox_messages m
    LEFT JOIN outbox_relays r ON r.id = m.claimed_by
    WHERE m.status = 'claimed' AND m.destination = @destination::uuid
      AND (r.id IS NULL
           OR r.heartbeat_at < now() - make_interval(secs => r.timeout_seconds)
           OR m.claimed_at < now() - make_interval(secs => r.claim_timeout_seconds))
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
        last_error = CASE WHEN l.relay_gone THEN 'the relay delivering it stopped; the receiver may have it'
                          ELSE 'claim timed out: the relay did not record an outcome' END
    FROM lost l
    WHERE m.id = l.id
    -- With what the rest needs of the lost claim, so that nothing joins
    -- the two again (as MessagesRecordOutcomes).
    RETURNING m.id, m.last_error, m.destination, m.attempts, m.attempts_before, m.ordering_key, l.claimed_at, l.relay_gone,
              CASE WHEN m.status = 'failed' THEN 'failed'
                   WHEN l.relay_gone THEN 'interrupted'
                   ELSE 'timeout' END AS outcome
), endpoint AS (
    UPDATE webhook_endpoints e
    SET last_attempt_at = now(),
        last_attempt_outcome = (SELECT r.outcome FROM released r ORDER BY r.outcome LIMIT 1),
        last_error_at = now(), last_error_status_code = NULL,
        last_error = (SELECT r.last_error FROM released r ORDER BY r.outcome LIMIT 1)
    WHERE e.id = @destination::uuid AND EXISTS (SELECT 1 FROM released)
), summed AS (
    INSERT INTO outbox_attempt_minutes AS t (destination, minute, outcome, le_ms, attempts, min_ms, max_ms)
    SELECT r.destination, date_trunc('minute', now()), r.outcome, 0, count(*),
           min(x.ms), max(x.ms)
    FROM released r
    CROSS JOIN LATERAL (SELECT GREATEST(EXTRACT(epoch FROM now() - r.claimed_at) * 1000, 0)::float8 AS ms) x
    GROUP BY 1, 3
    ORDER BY 1, 3
    ON CONFLICT (destination, minute, outcome, le_ms) DO UPDATE
    SET attempts = t.attempts + excluded.attempts,
        min_ms = LEAST(t.min_ms, excluded.min_ms),
        max_ms = GREATEST(t.max_ms, excluded.max_ms)
), history AS (
    INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, error)
    SELECT r.id, r.attempts_before + r.attempts, r.outcome, r.claimed_at, now(), r.last_error
    FROM released r
    ON CONFLICT DO NOTHING
)
SELECT r.ordering_key, r.outcome, r.relay_gone FROM released r;
