-- Partitions: outbox_events, outbox_messages and outbox_attempts are
-- partitioned by range of their ids, cut at the same times
-- (migration 00038), and retention drops a partition of each together.

-- name: PartitionsExtend :one
-- Creates the partitions, @span_seconds long, that cover the ids written
-- until @through, after the newest there is; returns how many spans it
-- added (outbox_partitions_extend).
SELECT outbox_partitions_extend(@through::timestamptz, make_interval(secs => @span_seconds::float8))::integer AS created;

-- name: Partitions :many
-- Every partition, oldest first, by its suffix (legacy, p20261207t0000),
-- its bounds, and the time its upper bound stands for: every row in it was
-- written before hi_at. The legacy partition's lower bound is the nil UUID.
SELECT p.suffix::text AS suffix,
       COALESCE(p.lo, '00000000-0000-0000-0000-000000000000'::uuid)::uuid AS lo,
       p.hi::uuid AS hi,
       outbox_uuid_time(p.hi)::timestamptz AS hi_at
FROM outbox_partitions() p;

-- name: PartitionHeld :one
-- What keeps the messages with ids from @lo to @hi (one partition) from
-- being dropped with their events and attempts: 'claimed', 'pending' or
-- 'failed' when one of them is, 'retention' when one was delivered or
-- discarded at or after @settled_before; '' when nothing does. Each is one
-- probe of a partial index, pruned to the partition.
SELECT (CASE
    WHEN EXISTS (SELECT 1 FROM outbox_messages m
                 WHERE m.id >= @lo::uuid AND m.id < @hi::uuid AND m.status = 'claimed') THEN 'claimed'
    WHEN EXISTS (SELECT 1 FROM outbox_messages m
                 WHERE m.id >= @lo::uuid AND m.id < @hi::uuid AND m.status = 'pending' AND NOT m.parked) THEN 'pending'
    -- Only a keyed message is parked: the ordering index holds them all.
    WHEN EXISTS (SELECT 1 FROM outbox_messages m
                 WHERE m.id >= @lo::uuid AND m.id < @hi::uuid AND m.ordering_key IS NOT NULL
                   AND m.status = 'pending' AND m.parked) THEN 'pending'
    WHEN EXISTS (SELECT 1 FROM outbox_messages m
                 WHERE m.id >= @lo::uuid AND m.id < @hi::uuid AND m.status = 'failed') THEN 'failed'
    WHEN EXISTS (SELECT 1 FROM outbox_messages m
                 WHERE m.id >= @lo::uuid AND m.id < @hi::uuid AND m.status = 'delivered'
                   AND m.delivered_at >= @settled_before::timestamptz) THEN 'retention'
    WHEN EXISTS (SELECT 1 FROM outbox_messages m
                 WHERE m.id >= @lo::uuid AND m.id < @hi::uuid AND m.status = 'discarded'
                   AND m.discarded_at >= @settled_before::timestamptz) THEN 'retention'
    ELSE ''
END)::text AS held_by;

-- name: PartitionLockDrop :exec
-- Bounds how long the drop waits for its locks (the parents' ACCESS
-- EXCLUSIVE, which queues every order transaction and claim behind it):
-- past it the drop gives up and is tried again.
SET LOCAL lock_timeout = '100ms';

-- name: PartitionsState :one
-- The partitions at a glance, from the catalog alone: how many there are,
-- how far past now the newest reaches (ahead_seconds: writes fail once it
-- is below zero), and the oldest, by its suffix, its bounds and how long
-- ago the time of its upper bound passed (oldest_age_seconds).
SELECT count(*)::integer AS partitions,
       COALESCE(extract(epoch FROM max(outbox_uuid_time(p.hi)) - now()), 0)::float8 AS ahead_seconds,
       COALESCE((array_agg(p.suffix ORDER BY p.hi))[1], '')::text AS oldest,
       COALESCE((array_agg(p.lo ORDER BY p.hi))[1], '00000000-0000-0000-0000-000000000000')::uuid AS oldest_lo,
       COALESCE((array_agg(p.hi ORDER BY p.hi))[1], '00000000-0000-0000-0000-000000000000')::uuid AS oldest_hi,
       COALESCE(extract(epoch FROM now() - min(outbox_uuid_time(p.hi))), 0)::float8 AS oldest_age_seconds
FROM outbox_partitions() p;

-- name: PartitionsDetached :many
-- The tables a drop detached from outbox_events, outbox_messages and
-- outbox_attempts and has not dropped yet (by their names: a partition's,
-- no longer a partition).
SELECT c.relname::text
FROM pg_catalog.pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND NOT c.relispartition
  AND c.relname ~ '^outbox_(events|messages|attempts)_(legacy|p[0-9]{8}t[0-9]{4})$';
