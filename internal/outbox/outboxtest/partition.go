package outboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// PartitionsSince gives a fresh database partitions of the outbox tables
// from the start of from's day (UTC) on, a day each, so that a test can
// write rows of days ago and see the prune job drop them as it would in a
// database that has run since. A migrated database has one partition
// (legacy) for everything before the day after tomorrow of its
// migration; PartitionsSince drops it, which requires it to be empty,
// and makes the days from from up to the partitions after it.
func PartitionsSince(t testing.TB, pool *pgxpool.Pool, from time.Time) {
	t.Helper()
	ctx := context.Background()
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events_legacy)
		+ (SELECT count(*) FROM outbox_messages_legacy) + (SELECT count(*) FROM outbox_attempts_legacy)`).Scan(&rows))
	require.Zero(t, rows, "the legacy partition is empty: a fresh database")
	_, err := pool.Exec(ctx, `DROP TABLE outbox_attempts_legacy, outbox_messages_legacy, outbox_events_legacy`)
	require.NoError(t, err)
	var first time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT min(outbox_uuid_time(lo)) FROM outbox_partitions()`).Scan(&first))
	const day = 24 * time.Hour
	for lo := from.UTC().Truncate(day); lo.Before(first); lo = lo.Add(day) {
		hi := lo.Add(day)
		if hi.After(first) {
			hi = first
		}
		_, err := pool.Exec(ctx, `SELECT outbox_partition_create($1, $2)`, lo, hi)
		require.NoError(t, err)
	}
}
