-- The relays as the admin API and the ops page see them (the relay's own
-- statements are in relay/).

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

-- name: RelaysCount :one
-- The live relays (see RelaysList).
SELECT count(*) FROM outbox_relays
WHERE heartbeat_at >= now() - make_interval(secs => timeout_seconds);

