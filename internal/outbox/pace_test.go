package outbox_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// A receiver that can take several times the load, but answers 503 to a
// request beyond its small worker pool (as a server with a fixed pool of
// workers does), gets every message within seconds of coming back from an
// outage, and none fails, at the defaults. The relay comes back at a low
// pace and finds the pool's size; the refusals its own burst provokes cost
// no attempts. Before, the probe's success let the destination's whole
// concurrency out at once: most of the burst was refused, each refusal an
// attempt and a message sent down its retry schedule (5 s, then 5 min),
// and a third of the messages waited minutes while the receiver sat idle.
func TestAReceiverBackFromAnOutageIsNotFloodedOutOfItsAttempts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	const workers = 4
	var busy, refused atomic.Int64
	pool := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if busy.Add(1) > workers {
			busy.Add(-1)
			refused.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		defer busy.Add(-1)
		time.Sleep(5 * time.Millisecond) // a pool of 4 takes 800 a second
		rc.serve(w, r)
	})
	ep := f.endpoint(t, rc, "order.placed")
	addr := rc.srv.Listener.Addr().String()

	// The outage: nothing listens; the messages of 300 orders wait, and the
	// destination backs off as a whole.
	rc.srv.Listener.Close()
	const n = 300
	outboxtest.Seed(t, f.pool, ep.ID, n, "")
	f.startRelay(t, relay.Config{}, nil) // the defaults
	eventually(t, func() bool {
		e, err := f.admin.Endpoint(ctx, ep.ID)
		require.NoError(t, err)
		return e.State == outbox.HealthBackingOff
	}, "the destination backs off while its receiver is away")

	// Back: the same address, with a small pool of workers.
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(pool)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	back := time.Now()
	e, err := f.admin.Endpoint(ctx, ep.ID)
	require.NoError(t, err)
	probeBy := *e.NextProbeAt

	within(t, time.Until(probeBy)+10*time.Second, func() bool {
		var delivered int
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`).Scan(&delivered))
		return delivered == n
	}, "every message is delivered within seconds of the probe")
	t.Logf("delivered %d messages %s after the receiver came back (next probe was due after %s); the receiver refused %d requests beyond its pool of %d",
		n, time.Since(back).Round(time.Millisecond), probeBy.Sub(back).Round(time.Millisecond), refused.Load(), workers)
	require.Equal(t, n, rc.total(), "each once")
	var failed, spent int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE m.status = 'failed'),
		(SELECT count(*) FROM outbox_attempts a WHERE a.status_code = 503 AND a.started_at >= $1)
		FROM outbox_messages m`, back).Scan(&failed, &spent))
	require.Zero(t, failed, "none failed")
	require.Zero(t, spent, "no refusal of the relay's own burst cost a message an attempt")
	require.NotZero(t, refused.Load(), "the receiver did refuse the relay's bursts: the pace found its pool's size by them")
}
