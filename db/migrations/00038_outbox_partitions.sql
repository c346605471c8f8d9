-- +goose NO TRANSACTION
-- Each statement runs on its own, so that the one that reads the tables
-- whole (VALIDATE CONSTRAINT) does so without blocking the order
-- transactions, and every statement is safe to run again: a migration
-- interrupted half way is finished by the next `api migrate`.

-- +goose Up

-- outbox_events, outbox_messages and outbox_attempts become tables
-- partitioned by range of their id (the attempts by their message's id),
-- so that retention drops a whole partition of settled rows instead of
-- deleting them row by row. The ids are UUIDv7, whose first 48 bits are
-- the time of writing, and a delivery's id shares its event's time
-- prefix: the three tables are cut at the same times (outbox_uuid_at),
-- and a partition of events, the partition of their deliveries and the
-- partition of those deliveries' attempts hold the same span of time and
-- are dropped together. No created_at column is the key, so the primary
-- keys stay (id) and (message_id, attempt), and a lookup by id reads one
-- partition.
--
-- The tables as they are become the first partition of each, named
-- *_legacy, for every id up to two days ahead of the upgrade; from there
-- the relay's retention job creates partitions of OUTBOX_PARTITION_SPAN
-- ahead of time, and drops the legacy one like any other once its rows are
-- settled and past their retention. Attaching them does not read them
-- under a lock that stops writes: a CHECK constraint that implies the
-- partition's bound is validated first, while writes go on, and the
-- attach then trusts it.

-- The attempts' foreign key to the messages goes: a partition of messages
-- and its attempts are dropped together, and the deletes that remain
-- (MessagesPrune, MessagesPruneFailed) delete the attempts themselves.
ALTER TABLE outbox_attempts DROP CONSTRAINT IF EXISTS outbox_attempts_message_id_fkey;

-- The time in a UUIDv7 (its first 48 bits, Unix milliseconds): the bound
-- of a partition as a time.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_uuid_time(id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT to_timestamp(('x' || substr(replace(id::text, '-', ''), 1, 12))::bit(48)::bigint / 1000.0);
$$;
-- +goose StatementEnd

-- The partitions of outbox_messages, oldest first, with their bounds: lo
-- is NULL for the legacy partition, which starts at MINVALUE. The events'
-- and attempts' partitions have the same bounds and the same suffix.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_partitions() RETURNS TABLE (suffix text, lo uuid, hi uuid)
LANGUAGE sql STABLE AS $$
  SELECT substr(c.relname, length('outbox_messages_') + 1)::text,
         NULLIF(btrim(b[1], ''''), 'MINVALUE')::uuid,
         btrim(b[2], '''')::uuid
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid,
  LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \((.*)\) TO \((.*)\)') b
  WHERE i.inhparent = 'outbox_messages'::regclass
  ORDER BY 2 NULLS FIRST;
$$;
-- +goose StatementEnd

-- Creates the partition of each of the three tables for the ids written
-- from @lo to @hi, named for its start in UTC (p20261207t0000), with its
-- indexes named after the parent's (outbox_messages_pending_idx:
-- outbox_messages_p20261207t0000_pending_idx). Each is made on its own
-- and attached, which locks the parent in SHARE UPDATE EXCLUSIVE mode
-- only: order transactions and claims go on meanwhile.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_partition_create(lo timestamptz, hi timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  part text;
  tbl text;
  idx record;
BEGIN
  FOREACH tbl IN ARRAY ARRAY['outbox_events', 'outbox_messages', 'outbox_attempts'] LOOP
    part := tbl || '_' || to_char(lo AT TIME ZONE 'UTC', '"p"YYYYMMDD"t"HH24MI');
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', part, tbl);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   tbl, part, outbox_uuid_at(lo), outbox_uuid_at(hi));
    FOR idx IN
      SELECT c.relname AS child, p.relname AS parent
      FROM pg_index x
      JOIN pg_class c ON c.oid = x.indexrelid
      JOIN pg_inherits i ON i.inhrelid = x.indexrelid
      JOIN pg_class p ON p.oid = i.inhparent
      WHERE x.indrelid = part::regclass
    LOOP
      IF idx.child <> part || substr(idx.parent, length(tbl) + 1) THEN
        EXECUTE format('ALTER INDEX %I RENAME TO %I', idx.child, part || substr(idx.parent, length(tbl) + 1));
      END IF;
    END LOOP;
  END LOOP;
END $$;
-- +goose StatementEnd

-- Creates the partitions after the newest until they cover the ids
-- written before @through, each ending at a multiple of @span since the
-- Unix epoch (a day's end at midnight UTC), and returns how many it made.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_partitions_extend(through timestamptz, span interval) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  t timestamptz;
  next timestamptz;
  n integer := 0;
BEGIN
  IF span < interval '1 minute' THEN
    RAISE EXCEPTION 'outbox partition span % is shorter than a minute', span;
  END IF;
  -- One at a time: two relays' jobs, or a job and a migration.
  PERFORM pg_advisory_xact_lock(1869574764, 2);
  SELECT outbox_uuid_time(p.hi) INTO t FROM outbox_partitions() p ORDER BY p.hi DESC LIMIT 1;
  IF t IS NULL THEN
    RAISE EXCEPTION 'outbox_messages has no partition to extend';
  END IF;
  WHILE t < through LOOP
    next := date_bin(span, t, timestamptz '1970-01-01 00:00:00+00') + span;
    PERFORM outbox_partition_create(t, next);
    t := next;
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;
-- +goose StatementEnd

-- The bound each table is cut at: every id written before the start of
-- the day after tomorrow (UTC) stays in the legacy partition. Two days, so
-- that the ids written while the next statement reads the tables are all
-- within it. Replaced if
-- an earlier run of this migration stopped after adding it, so that its
-- bound is always ahead of the ids being written.
-- +goose StatementBegin
DO $$
DECLARE
  bound uuid := outbox_uuid_at(date_trunc('day', now(), 'UTC') + interval '2 days');
  tbl text;
  key text;
BEGIN
  IF (SELECT relkind FROM pg_class WHERE oid = 'outbox_messages'::regclass) = 'p' THEN
    RETURN;
  END IF;
  FOR tbl, key IN VALUES ('outbox_events', 'id'), ('outbox_messages', 'id'), ('outbox_attempts', 'message_id') LOOP
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT IF EXISTS outbox_legacy_bound', tbl);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT outbox_legacy_bound CHECK (%I < %L) NOT VALID', tbl, key, bound);
  END LOOP;
END $$;
-- +goose StatementEnd

-- Reads each table once, in SHARE UPDATE EXCLUSIVE mode: writes go on.
-- +goose StatementBegin
DO $$
DECLARE
  tbl text;
BEGIN
  FOREACH tbl IN ARRAY ARRAY['outbox_events', 'outbox_messages', 'outbox_attempts'] LOOP
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = tbl::regclass AND conname = 'outbox_legacy_bound' AND NOT convalidated) THEN
      EXECUTE format('ALTER TABLE %I VALIDATE CONSTRAINT outbox_legacy_bound', tbl);
    END IF;
  END LOOP;
END $$;
-- +goose StatementEnd

-- The conversion itself, one transaction, catalog changes only: each table
-- renamed to *_legacy with its indexes, a partitioned table made in its
-- place with the same columns, constraints and indexes (so the attach
-- adopts the legacy indexes rather than building new ones), the legacy
-- table attached up to its bound, and the views that read the tables
-- made again on the new ones. It holds ACCESS EXCLUSIVE locks on the three
-- tables for those catalog changes only: milliseconds, after the order
-- transactions running when it starts have ended.
-- +goose StatementBegin
DO $$
DECLARE
  tbl text;
  key text;
  bound uuid;
  legacy text;
  idx record;
  v record;
BEGIN
  IF (SELECT relkind FROM pg_class WHERE oid = 'outbox_messages'::regclass) = 'p' THEN
    RETURN;
  END IF;
  FOR tbl, key IN VALUES ('outbox_events', 'id'), ('outbox_messages', 'id'), ('outbox_attempts', 'message_id') LOOP
    legacy := tbl || '_legacy';
    SELECT (regexp_match(pg_get_constraintdef(oid), '''([0-9a-f-]+)'''))[1]::uuid INTO bound
    FROM pg_constraint WHERE conrelid = tbl::regclass AND conname = 'outbox_legacy_bound';
    FOR idx IN SELECT c.relname AS name FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid WHERE x.indrelid = tbl::regclass LOOP
      EXECUTE format('ALTER INDEX %I RENAME TO %I', idx.name, legacy || substr(idx.name, length(tbl) + 1));
    END LOOP;
    EXECUTE format('ALTER TABLE %I RENAME TO %I', tbl, legacy);
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (%I)', tbl, legacy, key);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT outbox_legacy_bound', tbl);
    FOR idx IN
      SELECT c.relname AS name, x.indisprimary AS primary, pg_get_indexdef(x.indexrelid) AS def,
             pg_get_constraintdef(k.oid) AS pk
      FROM pg_index x
      JOIN pg_class c ON c.oid = x.indexrelid
      LEFT JOIN pg_constraint k ON k.conindid = x.indexrelid AND k.contype = 'p'
      WHERE x.indrelid = legacy::regclass
    LOOP
      IF idx.primary THEN
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I %s', tbl, tbl || '_pkey', idx.pk);
      ELSE
        EXECUTE regexp_replace(idx.def, ' INDEX \S+ ON \S+ USING ',
                               format(' INDEX %I ON %I USING ', tbl || substr(idx.name, length(legacy) + 1), tbl));
      END IF;
    END LOOP;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)', tbl, legacy, bound);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT outbox_legacy_bound', legacy);
  END LOOP;

  -- The views on the tables (outbox_messages_inconsistent, ...) follow
  -- a rename: made again, they read the partitioned tables.
  FOR v IN
    SELECT DISTINCT w.oid, w.relname
    FROM pg_depend d
    JOIN pg_rewrite r ON r.oid = d.objid
    JOIN pg_class w ON w.oid = r.ev_class
    WHERE d.refobjid IN ('outbox_events_legacy'::regclass, 'outbox_messages_legacy'::regclass, 'outbox_attempts_legacy'::regclass)
      AND w.relkind = 'v'
  LOOP
    EXECUTE format('CREATE OR REPLACE VIEW %I AS %s', v.relname,
                   regexp_replace(pg_get_viewdef(v.oid), '\m(outbox_events|outbox_messages|outbox_attempts)_legacy\M', '\1', 'g'));
  END LOOP;
END $$;
-- +goose StatementEnd

-- A few days of partitions after the legacy one; the relay's retention
-- job keeps them ahead from here on.
SELECT outbox_partitions_extend(now() + interval '3 days', interval '1 day');

-- +goose Down
-- No way down: the partitions past the legacy one would have to be copied
-- back into plain tables, under locks that stop the order transactions for
-- as long as the copy takes. Restore a backup taken before the upgrade.
-- +goose StatementBegin
DO $$ BEGIN
  RAISE EXCEPTION 'the outbox tables stay partitioned: restore a backup taken before migration 38 to go back';
END $$;
-- +goose StatementEnd
