-- +goose Up

-- outbox_uuid_v7 returns a time-ordered UUID (version 7), so message ids sort by
-- creation time: the primary key then doubles as the "newest first" index for the
-- admin listing, and webhook-ids are readable in order by consumers.
-- +goose StatementBegin
CREATE FUNCTION outbox_uuid_v7() RETURNS uuid
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

-- A webhook receiver and the event types it subscribes to.
CREATE TABLE webhook_endpoints (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    url             text        NOT NULL,
    -- "whsec_<base64>": the relay signs with the current value at delivery time.
    secret          text        NOT NULL,
    event_types     text[]      NOT NULL CHECK (cardinality(event_types) > 0),
    enabled         boolean     NOT NULL DEFAULT true,
    -- Why the relay disabled it (for example "410 Gone"); NULL while enabled.
    disabled_reason text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per (event, destination). The status machine is spelled out in
-- strings, with CHECKs, so a person reading the table sees what happened.
CREATE TABLE outbox_messages (
    id              uuid        PRIMARY KEY DEFAULT outbox_uuid_v7(),
    type            text        NOT NULL,
    -- The webhook endpoint this row is for. Deliberately no foreign key: an FK
    -- check takes a KEY SHARE lock on the endpoint row in every order
    -- transaction, turning one endpoint into a contended row (multixacts) on
    -- the write path. The relay handles a missing endpoint explicitly.
    destination     uuid        NOT NULL,
    -- Snapshot of the event data at commit time; delivery never re-reads the
    -- business rows.
    payload         jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'claimed', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- Set by the claim, cleared when the outcome is recorded; outcomes are
    -- only recorded where the token still matches, so a stale deliver job
    -- cannot overwrite a newer claim.
    claim_token     uuid,
    claimed_at      timestamptz,
    delivered_at    timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_messages_claim_consistent
        CHECK ((status = 'claimed') = (claim_token IS NOT NULL AND claimed_at IS NOT NULL)),
    CONSTRAINT outbox_messages_delivered_consistent
        CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);

-- The claim's index: partial on pending rows, so its size and the claim's
-- cost depend on the backlog, never on the delivered history kept for audit.
CREATE INDEX outbox_messages_pending_idx ON outbox_messages (next_attempt_at, id)
    WHERE status = 'pending';
-- Finds claims whose relay died (claim timeout).
CREATE INDEX outbox_messages_claimed_idx ON outbox_messages (claimed_at)
    WHERE status = 'claimed';
-- The prune job walks delivered rows by age.
CREATE INDEX outbox_messages_delivered_idx ON outbox_messages (delivered_at)
    WHERE status = 'delivered';
-- Failed rows wait for a person: listing them must stay cheap.
CREATE INDEX outbox_messages_failed_idx ON outbox_messages (id)
    WHERE status = 'failed';

-- +goose Down
DROP TABLE outbox_messages;
DROP TABLE webhook_endpoints;
DROP FUNCTION outbox_uuid_v7();
