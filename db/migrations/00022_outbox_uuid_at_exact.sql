-- +goose Up

-- outbox_uuid_at bounds time ranges of events and deliveries by id. It kept
-- only the millisecond and zeros after it, so as an upper bound it left out
-- every id of the bound's own millisecond (an id's version bits make it
-- larger than the zeros): an event written 300 µs before the end of a
-- replay's range was not in it. It now carries the version and the fraction
-- of the millisecond exactly as outbox_uuid_v7_at writes them, so for ids
-- written by outbox_uuid_v7_at and times at the database's microsecond
-- precision, id >= outbox_uuid_at(t) holds exactly when the id was written
-- at t or later (a microsecond spans four steps of the 12-bit fraction).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_uuid_at(at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT encode(
    int8send(
      ((floor(extract(epoch FROM at) * 1000)::bigint) << 16)
      | x'7000'::bigint
      | floor((extract(epoch FROM at) * 1000 - floor(extract(epoch FROM at) * 1000)) * 4096)::bigint)
    || '\x0000000000000000'::bytea,
    'hex')::uuid;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_uuid_at(at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT encode(substring(int8send(floor(extract(epoch FROM at) * 1000)::bigint) FROM 3) || '\x00000000000000000000'::bytea, 'hex')::uuid;
$$;
-- +goose StatementEnd
