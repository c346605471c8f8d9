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

-- name: EndpointsDisable :exec
-- Disables endpoints that told us they are gone (410); a person re-enables.
UPDATE webhook_endpoints
SET enabled = false, disabled_reason = @reason, updated_at = now()
WHERE id = ANY (@ids::uuid[]) AND enabled;

-- name: EndpointSetEnabled :one
UPDATE webhook_endpoints
SET enabled = @enabled,
    disabled_reason = CASE WHEN @enabled::boolean THEN NULL ELSE @reason END,
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
