-- +goose Up

-- Sessions of the ops page's login form. The cookie holds a random id; the
-- database holds only its HMAC (keyed from the admin token), so neither a
-- copy of this table nor a leaked backup gives a usable cookie, and changing
-- the admin token ends every session. Logging out deletes the row, which
-- ends the session for every api process at once; expired rows are deleted
-- at the next login.
CREATE TABLE ops_sessions (
    id_hash    bytea       PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE ops_sessions;
