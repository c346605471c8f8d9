package admin

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
)

// A storm of scrapes within backlogCacheFor reads the database once, and
// concurrent scrapes wait for that one read; the first scrape after the
// window reads again and sees what changed.
func TestBacklogCollectorReadsOncePerWindow(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()

	c := NewBacklogCollector(pool)
	var reads atomic.Int64
	read := c.read
	c.read = func(ctx context.Context) (scrape, error) {
		reads.Add(1)
		return read(ctx)
	}
	advance := fakeClock(c)

	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	relays := func() float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "outbox_relays" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no outbox_relays in the scrape (the backlog read failed?)")
		return 0
	}

	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { _, _ = reg.Gather() })
	}
	wg.Wait()
	require.EqualValues(t, 1, reads.Load(), "50 concurrent scrapes must read the database once")
	require.Zero(t, relays())

	_, err := pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid) VALUES ($1, 'metrics-test', 1)`, uuid.New())
	require.NoError(t, err)
	advance(backlogCacheFor - time.Millisecond)
	require.Zero(t, relays(), "within the window the cached reading is served, not the new row")
	require.EqualValues(t, 1, reads.Load(), "every scrape within %s must be served by the one read", backlogCacheFor)

	advance(time.Millisecond)
	require.EqualValues(t, 1, relays(), "the first scrape after the window reads again and sees the new relay")
	require.EqualValues(t, 2, reads.Load())
}

// A reading slower than a scrape waits (here: held up by a lock on the
// messages table, as a count over millions of waiting messages is held up by
// their number) does not take the gauges away: the scrape serves the
// previous reading after backlogScrapeWait, says how old it is, and the
// reading lands when it ends. Close ends a reading in progress at once, so
// the pool can close.
func TestBacklogCollectorServesThePreviousReadingWhileASlowOneRuns(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()

	c := NewBacklogCollector(pool)
	advance := fakeClock(c)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	gauges := func() map[string]float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		g := map[string]float64{}
		for _, f := range families {
			g[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
		}
		return g
	}
	running := func() chan struct{} { c.mu.Lock(); defer c.mu.Unlock(); return c.running }

	first := gauges()
	require.EqualValues(t, 1, first["outbox_backlog_scrape_success"])
	require.Zero(t, first["outbox_relays"])
	require.Zero(t, first["outbox_backlog_reading_age_seconds"], "a scrape that waited for its reading serves it fresh")

	_, err := pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid) VALUES ($1, 'metrics-test', 1)`, uuid.New())
	require.NoError(t, err)
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	advance(backlogCacheFor)
	start := time.Now()
	stale := gauges()
	waited := time.Since(start)
	require.GreaterOrEqual(t, waited, backlogScrapeWait, "the scrape waits for the reading up to backlogScrapeWait")
	require.Less(t, waited, backlogScrapeWait+time.Second, "and no longer")
	held := running()
	require.NotNil(t, held, "the reading is still running, held by the lock")
	require.EqualValues(t, 1, stale["outbox_backlog_scrape_success"], "the previous reading is served, not an error")
	require.Zero(t, stale["outbox_relays"], "the previous reading, from before the relay row")
	require.EqualValues(t, backlogCacheFor.Seconds(), stale["outbox_backlog_reading_age_seconds"], "and says how old it is")

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%name: OpsBacklog%'`).Scan(&n))
	require.Equal(t, 1, n, "one reading waits on the lock, however many scrapes came")

	require.NoError(t, lock.Rollback(ctx))
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the reading did not end once the lock was released")
	}
	fresh := gauges()
	require.EqualValues(t, 1, fresh["outbox_relays"], "the reading that was held up lands")
	require.Zero(t, fresh["outbox_backlog_reading_age_seconds"])

	// Close while a reading waits on a lock: it is cancelled, not left to
	// hold a connection for its budget.
	lock, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	advance(backlogCacheFor)
	_ = gauges()
	require.NotNil(t, running())
	start = time.Now()
	c.Close()
	require.Less(t, time.Since(start), time.Second, "Close cancels the reading in progress")
	require.Nil(t, running())
}

// A reading that takes long (a count over millions of waiting messages) is
// reused for backlogReadShare times as long as it took, so that the
// database spends at most a tenth of a connection's time on each process's
// gauges, however often they are scraped.
func TestBacklogCollectorReadsASlowBacklogLessOften(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)

	c := NewBacklogCollector(pool)
	t.Cleanup(c.Close)
	advance := fakeClock(c)
	const took = 2 * time.Second
	var reads atomic.Int64
	read := c.read
	c.read = func(ctx context.Context) (scrape, error) {
		reads.Add(1)
		advance(took) // the reading's cost, on the collector's clock
		return read(ctx)
	}
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	scrape := func() {
		_, err := reg.Gather()
		require.NoError(t, err)
	}

	scrape()
	require.EqualValues(t, 1, reads.Load())
	advance(backlogReadShare*took - time.Millisecond)
	scrape()
	require.EqualValues(t, 1, reads.Load(), "a reading that took %s is reused for %s", took, backlogReadShare*took)
	advance(time.Millisecond)
	scrape()
	require.EqualValues(t, 2, reads.Load(), "and read again after")
}

// fakeClock gives c a clock that stands still until the returned func moves
// it on.
func fakeClock(c *BacklogCollector) (advance func(time.Duration)) {
	var mu sync.Mutex
	now := time.Now()
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	return func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
}

// The partitions' gauges come from the catalog: how far ahead the newest
// partition reaches (what the partitions alert watches), and how old the
// oldest is, labelled by what it holds, which follows its messages.
func TestBacklogCollectorReportsThePartitions(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	var end time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(outbox_uuid_time(hi)) FROM outbox_partitions()`).Scan(&end))
	gauges := func() map[string]float64 {
		c := NewBacklogCollector(pool)
		t.Cleanup(c.Close)
		reg := prometheus.NewRegistry()
		require.NoError(t, reg.Register(c))
		families, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				name := f.GetName()
				for _, l := range m.GetLabel() {
					name += "," + l.GetName() + "=" + l.GetValue()
				}
				got[name] = m.GetGauge().GetValue()
			}
		}
		return got
	}
	g := gauges()
	require.InDelta(t, time.Until(end).Seconds(), g["outbox_partitions_ahead_seconds"], 60)
	require.Greater(t, g["outbox_partitions_ahead_seconds"], float64(24*3600), "a fresh database has days of partitions")
	require.Contains(t, g, "outbox_partition_oldest_age_seconds,held_by=none", "the oldest partition holds nothing yet")

	_, err := pool.Exec(ctx, `WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at) VALUES (outbox_uuid_v7(), 'order.placed', '{}', now()) RETURNING id)
		INSERT INTO outbox_messages (id, event_id, type, destination)
		SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', gen_random_uuid() FROM ev`)
	require.NoError(t, err)
	require.Contains(t, gauges(), "outbox_partition_oldest_age_seconds,held_by=pending")
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now()`)
	require.NoError(t, err)
	require.Contains(t, gauges(), "outbox_partition_oldest_age_seconds,held_by=settled")
}
