-- name: EndpointInsert :one
INSERT INTO webhook_endpoints (url, secret, event_types)
VALUES (@url, @secret, @event_types)
RETURNING *;

-- name: EndpointGet :one
SELECT * FROM webhook_endpoints WHERE id = @id;

-- name: EndpointList :many
SELECT * FROM webhook_endpoints ORDER BY created_at, id;

-- name: EndpointDelete :execrows
DELETE FROM webhook_endpoints WHERE id = @id;

-- name: EndpointSetEnabled :one
-- Pauses or resumes an endpoint. Messages for a paused endpoint are written
-- and wait; resuming an endpoint that is backing off also probes it at once,
-- instead of at its next scheduled probe.
UPDATE webhook_endpoints
SET enabled = @enabled,
    disabled_reason = CASE WHEN @enabled::boolean THEN NULL ELSE @reason END,
    backoff_until = CASE WHEN @enabled::boolean AND backoff_until > now() THEN now() ELSE backoff_until END,
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: EndpointRotateSecret :one
-- Replaces the signing secret, keeping the old one valid for @overlap_seconds:
-- until then every delivery carries a signature with each.
UPDATE webhook_endpoints
SET previous_secret = secret,
    previous_secret_expires_at = now() + make_interval(secs => @overlap_seconds::float8),
    secret = @secret,
    updated_at = now()
WHERE id = @id
RETURNING *;

-- name: EndpointStates :one
-- Endpoints by state, as the API names them: paused when disabled, else
-- their health.
SELECT count(*) FILTER (WHERE enabled AND health = 'healthy')     AS healthy,
       count(*) FILTER (WHERE enabled AND health = 'backing_off') AS backing_off,
       count(*) FILTER (WHERE NOT enabled)                        AS paused
FROM webhook_endpoints;
