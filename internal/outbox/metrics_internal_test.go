package outbox

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
	var mu sync.Mutex
	now := time.Now()
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }

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
