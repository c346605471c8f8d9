-- Sessions of the ops page's login form (internal/ops). @id_hash is the
-- HMAC of the cookie's random id: the cookie itself is never stored. Times
-- come from the page's clock, not the database's, so a session ends when
-- the page says.

-- name: OpsSessionInsert :exec
INSERT INTO ops_sessions (id_hash, expires_at) VALUES (@id_hash, @expires_at);

-- name: OpsSessionExpiry :one
-- No row: the session was never issued with this admin token, or it ended
-- (logging out in any api process deletes it).
SELECT expires_at FROM ops_sessions WHERE id_hash = @id_hash;

-- name: OpsSessionDelete :exec
DELETE FROM ops_sessions WHERE id_hash = @id_hash;

-- name: OpsSessionsDeleteExpired :execrows
-- Run at each login. The table holds a row per login within the session
-- lifetime, a handful: a scan of it costs less than an index to maintain.
DELETE FROM ops_sessions WHERE expires_at <= @now::timestamptz;
