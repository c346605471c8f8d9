package relay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/stretchr/testify/require"
)

// sweepCounter counts the stranded-message sweeps run through a pool.
type sweepCounter struct{ n atomic.Int64 }

func (c *sweepCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "name: MessagesPromoteStranded ") {
		c.n.Add(1)
	}
	return ctx
}

func (c *sweepCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A destination whose deliver jobs end often sweeps its stranded messages
// (MessagesPromoteStranded) at most once every strandedSweepEvery, not at
// every job's end: the sweep reads every parked message of the
// destination (0.5 to 0.8 s at 100,000 parked messages of 50,000 keys),
// and a job ends after four idle polls, so messages coming due in a
// trickle end jobs every few hundred milliseconds.
func TestJobEndsSweepStrandedMessagesAtMostOnceAWhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sweeps := &sweepCounter{}
	pool := dbtest.PoolTracedBy(t, sweeps)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	dest := outboxtest.Endpoint(t, pool, nil)
	_, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET url = $1 WHERE id = $2`, srv.URL, dest)
	require.NoError(t, err)
	startRelay(t, pool, nil)
	// The prune job run at the start sweeps every endpoint: let it end.
	require.Eventually(t, func() bool {
		var done bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE kind = 'outbox_prune' AND state = 'completed')`).Scan(&done))
		return done
	}, 20*time.Second, 10*time.Millisecond, "the prune job run at the start ended")

	before, start := sweeps.n.Load(), time.Now()
	const jobs = 5
	for range jobs {
		id := outboxtest.Seed(t, pool, dest, 1, "")[0]
		require.Eventually(t, func() bool {
			var status string
			var leased bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT m.status, e.lease_token IS NOT NULL
				FROM outbox_messages m JOIN webhook_endpoints e ON e.id = m.destination WHERE m.id = $1`, id).Scan(&status, &leased))
			return status == outbox.StatusDelivered && !leased
		}, 20*time.Second, 10*time.Millisecond, "delivered, and its job ended")
	}
	elapsed := time.Since(start)
	allowed := 1 + int64(elapsed/strandedSweepEvery)
	require.Less(t, allowed, int64(jobs), "the jobs ended within a few sweep intervals (%s): a slow machine proves nothing here", elapsed)
	require.LessOrEqual(t, sweeps.n.Load()-before, allowed,
		"%d job ends in %s sweep at most once every %s", jobs, elapsed.Round(time.Millisecond), strandedSweepEvery)
	require.Positive(t, sweeps.n.Load()-before, "a job's end still sweeps, once a while")
}
