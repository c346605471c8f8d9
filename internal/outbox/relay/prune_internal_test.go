package relay

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// The event prune looks at each old event once per run: its cursor walks
// past the events a delivery still keeps (waiting for a paused endpoint,
// failed and kept longer), so a batch never reads them again, and the
// events after them that nothing refers to any more are deleted.
func TestEventPruneWalksPastKeptEventsOnce(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	ep := outboxtest.Endpoint(t, pool, nil)
	kept := outboxtest.Seed(t, pool, ep, 3, "")    // their messages still wait
	settled := outboxtest.Seed(t, pool, ep, 5, "") // delivered, then pruned
	_, err := pool.Exec(ctx, `DELETE FROM outbox_messages WHERE id = ANY ($1)`, settled)
	require.NoError(t, err)
	cutoff := time.Now().Add(time.Second)

	q := outboxdb.New(pool)
	var batches []outboxdb.EventsPruneRow
	for after := uuid.Nil; ; {
		row, err := q.EventsPrune(ctx, after, cutoff, 2)
		require.NoError(t, err)
		batches = append(batches, outboxdb.EventsPruneRow{Scanned: row.Scanned, Deleted: row.Deleted})
		if row.Scanned < 2 {
			break
		}
		after = row.LastID
	}
	require.Equal(t, []outboxdb.EventsPruneRow{{Scanned: 2, Deleted: 0}, {Scanned: 2, Deleted: 1}, {Scanned: 2, Deleted: 2},
		{Scanned: 2, Deleted: 2}, {Scanned: 0, Deleted: 0}}, batches,
		"two kept events looked at once, then one kept and one settled, then the settled ones")
	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&events))
	require.Equal(t, len(kept), events, "the kept events stay, the others are gone")
}

// The orphan job discards what a deletion that ran out of time left of a
// deleted endpoint, also when nothing of it waits unparked any more: its
// messages parked behind an earlier one of their key (they were found only
// beside unparked ones), and its failed ones (they were not found at all,
// and counted in the failed total and its alert until their retention
// ended, while a retry of one answered 409).
func TestOrphanJobDiscardsWhatADeletionLeft(t *testing.T) {
	t.Parallel()
	for name, left := range map[string]struct{ key, set string }{
		"parked": {"order-1", "parked = true"},
		"failed": {"", "status = 'failed', attempts = 8, failed_at = now()"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, _ := deletedEndpoint(t, 3, left.key, left.set)
			ctx := context.Background()
			n, err := outboxdb.New(pool).MessagesDiscardOrphans(ctx, pruneBatch)
			require.NoError(t, err)
			require.EqualValues(t, 3, n)
			var undiscarded int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status <> 'discarded'`).Scan(&undiscarded))
			require.Zero(t, undiscarded)
		})
	}
}

// deletedEndpoint seeds n messages of an endpoint (keyed by key, if any),
// sets them as set says (the SET list of an UPDATE), and deletes the
// endpoint's row, as a deletion that ran out of time leaves it.
func deletedEndpoint(t *testing.T, n int, key, set string) (*pgxpool.Pool, uuid.UUID) {
	t.Helper()
	pool, ep, ids := seededEndpoint(t, n, key)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET `+set+` WHERE id = ANY ($1)`, ids)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, ep)
	require.NoError(t, err)
	return pool, ep
}

// A settling statement that waited for a row's lock re-reads the row when
// it gets it: the failed prune keeps a message a person requeued meanwhile
// (READ COMMITTED re-checks only the outer WHERE).
func TestSettlingStatementsRecheckRowsTheyWaitedFor(t *testing.T) {
	t.Parallel()
	pool, ep, ids := seededEndpoint(t, 2, "")
	ctx := context.Background()
	requeued, failed := ids[0], ids[1]
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', attempts = 1, failed_at = now() - interval '1 hour' WHERE id = ANY ($1)`, ids)
	require.NoError(t, err)
	q := outboxdb.New(pool)

	// waitBehind runs stmt while tx holds the row it wants, and returns
	// what it changed once tx commits.
	waitBehind := func(t *testing.T, change string, id uuid.UUID, stmt func() (int64, error)) int64 {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, change, id)
		require.NoError(t, err)
		type result struct {
			n   int64
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, err := stmt()
			done <- result{n, err}
		}()
		require.Eventually(t, func() bool {
			var waiting bool
			err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
			return err == nil && waiting
		}, 10*time.Second, 5*time.Millisecond, "the statement waits for the row")
		require.NoError(t, tx.Commit(ctx))
		r := <-done
		require.NoError(t, r.err)
		return r.n
	}

	n := waitBehind(t, `UPDATE outbox_messages SET status = 'pending', attempts_before = attempts, attempts = 0 WHERE id = $1`, requeued,
		func() (int64, error) {
			keys, err := q.MessagesPruneFailed(ctx, ep, time.Now(), pruneBatch)
			return int64(len(keys)), err
		})
	require.EqualValues(t, 1, n, "the requeued message is no longer failed: the prune keeps it, and deletes the other")

	rows, err := pool.Query(ctx, `SELECT id FROM outbox_messages ORDER BY id`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{requeued}, left, "%v was pruned", failed)
	var broken int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages_inconsistent`).Scan(&broken))
	require.Zero(t, broken)
}

// The per-minute sums are forgotten in bounded batches, oldest first, so a
// day of a thousand endpoints' minutes is many short deletes, not one that
// holds the table's WAL and locks for seconds; the minutes still read stay.
func TestAttemptMinutesArePrunedInBoundedBatches(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	ep := outboxtest.Endpoint(t, pool, nil)
	_, err := pool.Exec(ctx, `INSERT INTO outbox_attempt_minutes (destination, minute, outcome, le_ms, attempts, min_ms, max_ms)
		SELECT $1, date_trunc('minute', now()) - g * interval '1 minute', 'delivered', 50, 1, 1, 1
		FROM generate_series(0, 24) g`, ep)
	require.NoError(t, err)
	// Minutes 11 to 24 ago: 14 rows (the database's clock, which wrote them).
	var before time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT date_trunc('minute', now()) - interval '10 minutes 30 seconds'`).Scan(&before))

	q := outboxdb.New(pool)
	var batches []int64
	for {
		n, err := q.AttemptMinutesPrune(ctx, before, 5)
		require.NoError(t, err)
		batches = append(batches, n)
		if n < 5 {
			break
		}
	}
	require.Equal(t, []int64{5, 5, 4}, batches, "at most a batch per statement, until fewer are left")
	var left, oldest int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), max(extract(epoch FROM date_trunc('minute', now()) - minute) / 60)::int
		FROM outbox_attempt_minutes`).Scan(&left, &oldest))
	require.Equal(t, 11, left, "the minutes after the cutoff stay")
	require.Equal(t, 10, oldest)
}
