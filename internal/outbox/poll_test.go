package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// counter reads one counter from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// An idle relay polls every interval (its heartbeat rises) but starts no
// River job for it; the first due message starts a deliver job at once.
func TestIdleRelayPollsWithoutStartingJobs(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")

	metrics := relay.NewMetrics()
	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg))
	rl, err := relay.New(f.pool, relay.Config{},
		&relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}, discardLogger(), metrics)
	require.NoError(t, err)
	require.NoError(t, rl.Start(ctx))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = rl.Stop(c)
	})

	within(t, 10*time.Second, func() bool { return counter(t, reg, "outbox_polls_total") >= 25 }, "the heartbeat rises while idle")
	var jobs int
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver'").Scan(&jobs))
	require.Zero(t, jobs, "25 polls of an idle relay started no job")

	id := f.enqueue(t, "order.placed", 1)[0]
	within(t, 5*time.Second, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "a due message starts a deliver job")
}
