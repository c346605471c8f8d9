-- +goose Up

-- Ids with microsecond order. A UUIDv7 whose 12 bits after the version hold
-- the fraction of the millisecond (RFC 9562, method 3), read from the
-- database's clock when the row is written: two events written one after
-- the other, even within a millisecond, get ids in that order. Ordered
-- delivery relies on it (see outbox_messages.ordering_key).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_uuid_v7_at(at timestamptz) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT encode(
    overlay(uuid_send(gen_random_uuid())
            placing int8send(
              ((floor(extract(epoch FROM at) * 1000)::bigint) << 16)
              | x'7000'::bigint
              | floor((extract(epoch FROM at) * 1000 - floor(extract(epoch FROM at) * 1000)) * 4096)::bigint)
            FROM 1 FOR 8),
    'hex')::uuid;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT outbox_uuid_v7_at(clock_timestamp());
$$;
-- +goose StatementEnd

-- A delivery's id shares its event's first 64 bits (time, version and the
-- fraction of the millisecond) and is random after them: deliveries sort
-- with their events, and the deliveries of one event are a range of the
-- primary key (outbox_uuid_floor to outbox_uuid_ceil), found without an
-- index on event_id that every order transaction would have to maintain.
-- +goose StatementBegin
CREATE FUNCTION outbox_uuid_sibling(of uuid) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT encode(overlay(uuid_send(gen_random_uuid()) placing substring(uuid_send(of) FROM 1 FOR 8) FROM 1 FOR 8), 'hex')::uuid;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox_uuid_floor(of uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT encode(substring(uuid_send(of) FROM 1 FOR 8) || '\x0000000000000000'::bytea, 'hex')::uuid;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox_uuid_ceil(of uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT encode(substring(uuid_send(of) FROM 1 FOR 8) || '\xffffffffffffffff'::bytea, 'hex')::uuid;
$$;
-- +goose StatementEnd

-- The smallest id of the millisecond at: with the primary key, a time range
-- of events or deliveries is a range of ids.
-- +goose StatementBegin
CREATE FUNCTION outbox_uuid_at(at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT encode(substring(int8send(floor(extract(epoch FROM at) * 1000)::bigint) FROM 3) || '\x00000000000000000000'::bytea, 'hex')::uuid;
$$;
-- +goose StatementEnd

-- One row per event, whether anyone subscribed or not, kept for the
-- retention: what was announced, and what a replay re-sends. Its id is the
-- event id every delivery carries (webhook-id). payload is json, not jsonb:
-- it is stored and sent as written, never queried inside, and json costs
-- the write path less.
CREATE TABLE outbox_events (
    id            uuid        PRIMARY KEY,
    type          text        NOT NULL,
    payload       json        NOT NULL,
    -- The OpenTelemetry propagation fields of the request that enqueued it.
    trace_context jsonb,
    -- Events of one ordering key are delivered to each endpoint in the order
    -- they were written.
    ordering_key  text,
    created_at    timestamptz NOT NULL
);

-- Every existing message becomes its own event, under its own id: a message
-- being retried keeps the webhook-id its receiver has seen.
INSERT INTO outbox_events (id, type, payload, trace_context, created_at)
SELECT id, type, payload::json, trace_context, created_at FROM outbox_messages;

-- A message is now one delivery of an event to one destination. This
-- rewrites the table once (every row gets its event_id).
ALTER TABLE outbox_messages
    ADD COLUMN event_id     uuid,
    ADD COLUMN ordering_key text,
    -- Pending behind an earlier message of its destination and ordering
    -- key: not due, whatever next_attempt_at says, until that one settles.
    ADD COLUMN parked       boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT outbox_messages_parked_pending CHECK (status = 'pending' OR NOT parked);
UPDATE outbox_messages SET event_id = id;
ALTER TABLE outbox_messages
    ALTER COLUMN event_id SET NOT NULL,
    DROP COLUMN payload,
    DROP COLUMN trace_context;

-- The claim's index leaves parked messages out: however many wait behind one
-- key, they are never in the way of a claim.
DROP INDEX outbox_messages_pending_idx;
CREATE INDEX outbox_messages_pending_idx ON outbox_messages (destination, next_attempt_at, id)
    WHERE status = 'pending' AND NOT parked;

-- Per-key order. For a destination and a key, a delivery may be sent only
-- when no earlier one is unfinished. This index holds the unfinished
-- deliveries that can stand in a later one's way: claimed, failed, pending
-- after an attempt or a requeue, and parked. A new delivery, pending and
-- never attempted, is not in it, so the order transaction does not
-- maintain it.
CREATE INDEX outbox_messages_ordering_idx ON outbox_messages (destination, ordering_key, id)
    WHERE ordering_key IS NOT NULL
      AND (status IN ('claimed', 'failed')
           OR (status = 'pending' AND (attempts > 0 OR attempts_before > 0 OR parked)));

-- +goose Down
DROP INDEX outbox_messages_ordering_idx;
DROP INDEX outbox_messages_pending_idx;
ALTER TABLE outbox_messages
    ADD COLUMN payload       jsonb,
    ADD COLUMN trace_context jsonb;
UPDATE outbox_messages m SET payload = e.payload::jsonb, trace_context = e.trace_context
FROM outbox_events e WHERE e.id = m.event_id;
ALTER TABLE outbox_messages
    ALTER COLUMN payload SET NOT NULL,
    DROP CONSTRAINT outbox_messages_parked_pending,
    DROP COLUMN parked,
    DROP COLUMN event_id,
    DROP COLUMN ordering_key;
CREATE INDEX outbox_messages_pending_idx ON outbox_messages (destination, next_attempt_at, id)
    WHERE status = 'pending';
DROP TABLE outbox_events;
DROP FUNCTION outbox_uuid_at(timestamptz);
DROP FUNCTION outbox_uuid_ceil(uuid);
DROP FUNCTION outbox_uuid_floor(uuid);
DROP FUNCTION outbox_uuid_sibling(uuid);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT encode(
    set_bit(
      set_bit(
        overlay(uuid_send(gen_random_uuid())
                placing substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                FROM 1 FOR 6),
        52, 1),
      53, 1),
    'hex')::uuid;
$$;
-- +goose StatementEnd
DROP FUNCTION outbox_uuid_v7_at(timestamptz);
