package db_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/dbtest"
)

// The upgrade to partitioned outbox tables (migration 38), on a database
// whose tables hold a history of every kind: pending, parked, claimed,
// failed, delivered and discarded messages with their attempts. Nothing is
// lost or changed, the rows end in the legacy partition, and the order
// transactions writing beside the upgrade are never stopped for longer
// than the bound operations.md states: the tables are read while writes go
// on, and locked only for the catalog changes.
func TestPartitioningUpgradeLosesNothingAndKeepsWritesGoing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.EmptyURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqlDB.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, db.Migrations)
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 37)
	require.NoError(t, err)

	// 300,000 messages of every status, one event each, a third with an
	// attempt, keyed ones among them: enough that reading them under a
	// lock would stop the writes for a while.
	_, err = pool.Exec(ctx, `
		CREATE TEMP TABLE kinds (n integer, status text, parked boolean, set_at text);
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, ordering_key, created_at)
			SELECT outbox_uuid_v7(), 'order.placed', json_build_object('n', g), CASE WHEN g % 10 = 0 THEN 'key-' || (g % 100) END, now()
			FROM generate_series(1, 300000) g
			RETURNING id, ordering_key, (payload->>'n')::integer AS n)
		INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, status, parked, attempts,
		                             claim_token, claimed_at, delivered_at, discarded_at, failed_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', '00000000-0000-0000-0000-000000000001', ev.ordering_key,
		       s.status, s.status = 'pending' AND ev.ordering_key IS NOT NULL AND ev.n % 20 = 0,
		       CASE WHEN s.status IN ('failed', 'delivered') THEN 1 ELSE 0 END,
		       CASE WHEN s.status = 'claimed' THEN gen_random_uuid() END, CASE WHEN s.status = 'claimed' THEN now() END,
		       CASE WHEN s.status = 'delivered' THEN now() END, CASE WHEN s.status = 'discarded' THEN now() END,
		       CASE WHEN s.status = 'failed' THEN now() END
		FROM ev, LATERAL (SELECT (ARRAY['pending', 'claimed', 'delivered', 'delivered', 'failed', 'discarded'])[ev.n % 6 + 1] AS status) s;
		INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at)
		SELECT id, 1, 'retry', now() - interval '2 days', now() - interval '2 days' FROM outbox_messages WHERE attempts = 1;
		ANALYZE;`)
	require.NoError(t, err)
	snapshot := func() map[string]int64 {
		// The rows written before the upgrade: those of destination 1.
		rows, err := pool.Query(ctx, `
			SELECT status || CASE WHEN parked THEN ' parked' ELSE '' END, count(*) FROM outbox_messages
			WHERE destination = '00000000-0000-0000-0000-000000000001' GROUP BY 1
			UNION ALL SELECT 'events', count(*) FROM outbox_events e
			WHERE EXISTS (SELECT 1 FROM outbox_messages m WHERE m.event_id = e.id AND m.destination = '00000000-0000-0000-0000-000000000001')
			UNION ALL SELECT 'attempts', count(*) FROM outbox_attempts
			UNION ALL SELECT 'checksum', sum(hashtext(m.id::text || m.status || m.attempts || COALESCE(m.ordering_key, '') || e.payload::text))::bigint
			FROM outbox_messages m JOIN outbox_events e ON e.id = m.event_id
			WHERE m.destination = '00000000-0000-0000-0000-000000000001'`)
		require.NoError(t, err)
		got := map[string]int64{}
		for rows.Next() {
			var k string
			var n int64
			require.NoError(t, rows.Scan(&k, &n))
			got[k] = n
		}
		require.NoError(t, rows.Err())
		return got
	}
	before := snapshot()
	require.Positive(t, before["pending parked"])

	// Order transactions, one after the other, while the upgrade runs:
	// the longest one is how long the upgrade stopped the writes.
	var (
		wg      sync.WaitGroup
		done    = make(chan struct{})
		longest time.Duration
		writes  int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			start := time.Now()
			_, err := pool.Exec(ctx, `WITH ev AS (
					INSERT INTO outbox_events (id, type, payload, created_at)
					VALUES (outbox_uuid_v7(), 'order.placed', '{}', now()) RETURNING id)
				INSERT INTO outbox_messages (id, event_id, type, destination)
				SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', '00000000-0000-0000-0000-000000000002' FROM ev`)
			if err != nil {
				t.Errorf("an order transaction failed beside the upgrade: %v", err)
				return
			}
			longest = max(longest, time.Since(start))
			writes++
		}
	}()
	start := time.Now()
	_, err = provider.Up(ctx)
	took := time.Since(start)
	close(done)
	wg.Wait()
	require.NoError(t, err)
	t.Logf("upgrade of 300,000 messages: %s; %d writes beside it, the longest %s", took, writes, longest)
	// Reading the tables under the lock would stop the writes for most of
	// the upgrade: 300,000 rows take a few hundred milliseconds to read.
	require.Less(t, longest, took/3, "the writes were stopped only for the catalog changes")
	require.Less(t, longest, 500*time.Millisecond, "the bound operations.md states")

	require.Equal(t, before, snapshot(), "nothing lost, nothing changed")
	var written int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages
		WHERE destination = '00000000-0000-0000-0000-000000000002'`).Scan(&written))
	require.Equal(t, writes, written, "every write beside the upgrade is there")

	var legacy int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages_legacy`).Scan(&legacy))
	require.EqualValues(t, 300_000+writes, legacy, "the rows written before the bound are in the legacy partition")
	var parts []string
	rows, err := pool.Query(ctx, `SELECT suffix FROM outbox_partitions()`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		parts = append(parts, s)
	}
	require.True(t, slices.Contains(parts, "legacy") && len(parts) >= 3, "the legacy partition and days ahead: %v", parts)
	var inconsistent int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages_inconsistent`).Scan(&inconsistent))
	require.Zero(t, inconsistent, "the invariants' view reads the new tables")
}
