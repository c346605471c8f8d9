package relay

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A partition of the three tables is dropped, events, messages and
// attempts together, once every message in it is settled and past its
// retention; while one is pending, claimed or failed, or was settled
// within the retention, the partition is kept and says why, and the
// settled rows past their retention in it are deleted one by one instead.
// The test lives days ahead: its rows are written into partitions of the
// days after the legacy one, and its clock is the time at which they are
// all past their retention.
func TestPartitionsAreDroppedOnlyWhenSettledAndPastTheirRetention(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	ep := outboxtest.Endpoint(t, pool, nil)
	const day = 24 * time.Hour
	start := time.Now().UTC().Truncate(day) // the migration's partitions start at midnight, UTC
	q := outboxdb.New(pool)
	_, err := q.PartitionsExtend(ctx, start.Add(12*day), day.Seconds())
	require.NoError(t, err)

	// put writes an event and its message at time at (their ids', so in
	// the partition of that day) and sets the message as set says.
	put := func(at time.Time, set string) uuid.UUID {
		t.Helper()
		var id uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, `WITH ev AS (
				INSERT INTO outbox_events (id, type, payload, created_at)
				VALUES (outbox_uuid_sibling(outbox_uuid_at($1)), 'order.placed', '{}', $1) RETURNING id)
			INSERT INTO outbox_messages (id, type, destination, event_id, created_at)
			SELECT outbox_uuid_sibling(ev.id), 'order.placed', $2, ev.id, $1 FROM ev RETURNING id`, at, ep).Scan(&id))
		_, err := pool.Exec(ctx, `UPDATE outbox_messages SET `+set+` WHERE id = $1`, id)
		require.NoError(t, err)
		// An attempt in the history, finished long enough ago to be out
		// of the per-minute sums' day.
		_, err = pool.Exec(ctx, `INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at)
			VALUES ($1, 1, 'retry', now() - interval '2 days', now() - interval '2 days')`, id)
		require.NoError(t, err)
		return id
	}
	dayOf := func(d int) time.Time { return start.Add(time.Duration(d)*day + time.Hour) }
	suffix := func(d int) string { return "p" + start.Add(time.Duration(d)*day).Format("20060102") + "t0000" }
	now := start.Add(9*day + r.cfg.Retention + time.Hour) // every partition up to day 8 is past its retention
	cutoff := now.Add(-r.cfg.Retention)
	settledLongAgo := "status = 'delivered', delivered_at = '" + dayOf(3).Format(time.RFC3339) + "'"

	dropped := put(dayOf(3), settledLongAgo)
	put(dayOf(3), "status = 'discarded', discarded_at = '"+dayOf(3).Format(time.RFC3339)+"'")
	pending := put(dayOf(4), "next_attempt_at = now()")
	prunedBeside := put(dayOf(4), settledLongAgo)
	failed := put(dayOf(5), "status = 'failed', attempts = 9, failed_at = now()")
	claimed := put(dayOf(6), "status = 'claimed', claim_token = gen_random_uuid(), claimed_at = now()")
	recent := put(dayOf(7), "status = 'delivered', delivered_at = '"+now.Add(-time.Hour).Format(time.RFC3339)+"'")
	young := put(dayOf(10), settledLongAgo) // its partition is not past its retention

	// Every partition before day 9 is past its retention: the legacy one
	// (up to two days after the template of this database was made), then
	// a partition a day.
	parts, err := q.Partitions(ctx)
	require.NoError(t, err)
	var want []string
	for _, p := range parts {
		if p.HiAt.Before(cutoff) && !slices.Contains([]string{suffix(4), suffix(5), suffix(6), suffix(7)}, p.Suffix) {
			want = append(want, p.Suffix)
		}
	}
	require.Subset(t, want, []string{"legacy", suffix(3), suffix(8)})

	gone, kept, err := r.retainPartitions(ctx, now, cutoff)
	require.NoError(t, err)
	require.Equal(t, want, gone, "the partitions past their retention with nothing unsettled in them, the empty ones too")
	require.Equal(t, map[string]string{suffix(4): "pending", suffix(5): "failed", suffix(6): "claimed", suffix(7): "retention"}, kept.held)
	var day9 uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT outbox_uuid_at($1)`, start.Add(9*day)).Scan(&day9))
	require.Equal(t, day9, kept.before, "what is deleted one by one: below the end of the newest partition past its retention")
	for _, table := range partitionTables {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table+"_"+suffix(3)).Scan(&exists))
		require.False(t, exists, "%s went with the partition", table)
	}

	settled, _, err := r.prune(ctx, cutoff, now.Add(-r.cfg.FailedRetention), kept)
	require.NoError(t, err)
	require.EqualValues(t, 1, settled, "the settled message beside a pending one, and nothing else")
	var left []uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM outbox_messages`).Scan(&left))
	require.Equal(t, []uuid.UUID{pending, failed, claimed, recent, young}, left)
	var attempts, events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts WHERE message_id = ANY ($1)`,
		[]uuid.UUID{dropped, prunedBeside}).Scan(&attempts))
	require.Zero(t, attempts, "the attempts went with their messages")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&events))
	require.Equal(t, len(left), events, "the events of the messages left, and no other")
}

// A drop needs the parents locked for an instant, and a long statement on
// them (a report, a backup's COPY) holds them. The drop then waits at most
// its lock timeout each try, so an order transaction queued behind it waits
// no longer than that, and after a few tries it gives up, keeping the
// partition for the next run, which drops it.
func TestAPartitionDropHeldUpByAReaderGivesUpWithoutStoppingTheWrites(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	const day = 24 * time.Hour
	start := time.Now().UTC().Truncate(day)
	_, err := outboxdb.New(pool).PartitionsExtend(ctx, start.Add(6*day), day.Seconds())
	require.NoError(t, err)
	now := start.Add(6*day + r.cfg.Retention)
	cutoff := now.Add(-r.cfg.Retention)

	reader, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(ctx) }()
	_, err = reader.Exec(ctx, `SELECT count(*) FROM outbox_messages`)
	require.NoError(t, err)

	var (
		done    = make(chan struct{})
		stopped = make(chan struct{})
		longest time.Duration
	)
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
			}
			began := time.Now()
			_, err := pool.Exec(ctx, `WITH ev AS (
					INSERT INTO outbox_events (id, type, payload, created_at) VALUES (outbox_uuid_v7(), 'order.placed', '{}', now()) RETURNING id)
				INSERT INTO outbox_messages (id, event_id, type, destination, status, delivered_at)
				SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', gen_random_uuid(), 'delivered', now() FROM ev`)
			if err != nil {
				t.Errorf("an order transaction beside the drop: %v", err)
				return
			}
			longest = max(longest, time.Since(began))
		}
	}()
	gone, _, err := r.retainPartitions(ctx, now, cutoff)
	close(done)
	<-stopped
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "the drop gave up on its lock")
	require.Empty(t, gone)
	require.Less(t, longest, 400*time.Millisecond, "a write waited at most about the drop's lock timeout (100 ms)")

	require.NoError(t, reader.Rollback(ctx))
	gone, _, err = r.retainPartitions(ctx, now, cutoff)
	require.NoError(t, err)
	require.Contains(t, gone, "legacy", "the next run drops what the reader held up: the legacy partition, of the writes' day, delivered")
}

// A relay that dies between detaching a partition and dropping it leaves
// the detached tables behind, outside the outbox tables: the next prune
// drops them.
func TestAPartitionDetachedByADeadRelayIsDroppedByTheNext(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	const suffix = "legacy" // the oldest, as a drop detaches them
	for _, table := range partitionTables {
		_, err := pool.Exec(ctx, `ALTER TABLE `+table+` DETACH PARTITION `+table+`_`+suffix)
		require.NoError(t, err)
	}
	_, _, err := r.retainPartitions(ctx, time.Now(), time.Now().Add(-r.cfg.Retention))
	require.NoError(t, err)
	for _, table := range partitionTables {
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table+"_"+suffix).Scan(&exists))
		require.False(t, exists, "%s_%s, detached and left, is dropped", table, suffix)
	}
}
