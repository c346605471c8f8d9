-- +goose Up

-- Each relay process (cmd/worker) while it lives: it heartbeats every second
-- and any relay that sees a heartbeat older than the relay timeout declares
-- it dead, returns its claims to pending and frees the destinations it was
-- serving. This is what lets a surviving worker take over a killed worker's
-- messages within seconds, instead of waiting out the claim timeout.
CREATE TABLE outbox_relays (
    id           uuid        PRIMARY KEY,
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- A claim now names the relay that holds it, so it dies with that relay.
-- 'discarded' settles the messages of a deleted endpoint: they will never be
-- sent, and unlike 'failed' they wait for nobody. The constraints are added
-- NOT VALID (a brief lock, no scan) and validated in the next migration,
-- outside this transaction, where a scan of a large table blocks no writes.
ALTER TABLE outbox_messages
    ADD COLUMN claimed_by   uuid,
    ADD COLUMN discarded_at timestamptz;
ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_status_check;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_status_check
    CHECK (status IN ('pending', 'claimed', 'delivered', 'failed', 'discarded')) NOT VALID;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_discarded_consistent
    CHECK ((status = 'discarded') = (discarded_at IS NOT NULL)) NOT VALID;

-- The relay's view of each endpoint, written only by the job serving it.
ALTER TABLE webhook_endpoints
    -- Health. consecutive_failures counts endpoint-wide failures in a row
    -- (refused, timed out, 5xx, 429); at the relay's threshold the endpoint
    -- is 'backing_off' as a whole: nothing is sent until backoff_until, then
    -- one message probes it, and the first answer makes it 'healthy' again.
    -- health_reason keeps the failure that made it back off.
    ADD COLUMN health               text        NOT NULL DEFAULT 'healthy'
                                    CHECK (health IN ('healthy', 'backing_off')),
    ADD COLUMN health_reason        text,
    ADD COLUMN health_changed_at    timestamptz,
    ADD COLUMN consecutive_failures integer     NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    -- Nothing is claimed for the endpoint before this: the next probe while
    -- backing off, or the end of a Retry-After the receiver asked for.
    ADD COLUMN backoff_until        timestamptz,
    -- Scheduling: one deliver job at a time serves an endpoint. dispatched_at
    -- is set when a job for it is queued; lease_token and lease_relay name
    -- the running job and its relay. A lease whose relay is dead is free.
    ADD COLUMN dispatched_at        timestamptz,
    ADD COLUMN lease_token          uuid,
    ADD COLUMN lease_relay          uuid;

-- +goose Down
ALTER TABLE webhook_endpoints
    DROP COLUMN health,
    DROP COLUMN health_reason,
    DROP COLUMN health_changed_at,
    DROP COLUMN consecutive_failures,
    DROP COLUMN backoff_until,
    DROP COLUMN dispatched_at,
    DROP COLUMN lease_token,
    DROP COLUMN lease_relay;
DELETE FROM outbox_messages WHERE status = 'discarded';
ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_discarded_consistent;
ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_status_check;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_status_check
    CHECK (status IN ('pending', 'claimed', 'delivered', 'failed'));
ALTER TABLE outbox_messages
    DROP COLUMN claimed_by,
    DROP COLUMN discarded_at;
DROP TABLE outbox_relays;
