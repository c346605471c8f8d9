package outbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// byEndpoint reads a counter family by endpoint id and outcome.
func byEndpoint(t *testing.T, reg *prometheus.Registry, name string) map[[2]string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[[2]string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[[2]string{labels["endpoint"], labels["outcome"]}] = m.GetCounter().GetValue()
		}
	}
	return out
}

// endpointsIn returns the endpoint ids a family has series for.
func endpointsIn(t *testing.T, reg *prometheus.Registry, name string) map[string]bool {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]bool{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" {
					out[l.GetValue()] = true
				}
			}
		}
	}
	return out
}

// Deliveries are counted by endpoint too, so one endpoint's failures are
// told from another's successes; the switch leaves those series out.
func TestDeliveryMetricsByEndpoint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ok, refusing := newReceiver(t), newReceiver(t)
	refusing.respond = func(*http.Request, int) int { return http.StatusUnprocessableEntity }
	okEP, refusingEP := f.endpoint(t, ok, "order.placed"), f.endpoint(t, refusing, "order.placed")

	start := func(opts ...relay.MetricsOption) *prometheus.Registry {
		metrics := relay.NewMetrics(opts...)
		reg := prometheus.NewRegistry()
		require.NoError(t, metrics.Register(reg))
		cfg := fastConfig()
		cfg.MaxAttempts = 1
		rl, err := relay.New(f.pool, cfg, &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
			discardLogger(), metrics)
		require.NoError(t, err)
		require.NoError(t, rl.Start(ctx))
		t.Cleanup(func() {
			c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = rl.Stop(c)
		})
		return reg
	}
	reg := start()
	f.enqueue(t, "order.placed", 1)
	f.enqueue(t, "order.placed", 2)
	f.enqueue(t, "order.placed", 3)
	want := map[[2]string]float64{
		{okEP.ID.String(), "delivered"}:    3,
		{refusingEP.ID.String(), "failed"}: 3,
	}
	within(t, 10*time.Second, func() bool {
		got := byEndpoint(t, reg, "outbox_endpoint_deliveries_total")
		return got[[2]string{okEP.ID.String(), "delivered"}] == 3 && got[[2]string{refusingEP.ID.String(), "failed"}] == 3
	}, "each endpoint's outcomes under its own id")
	require.Equal(t, want, byEndpoint(t, reg, "outbox_endpoint_deliveries_total"), "nothing else counted")
	require.Equal(t, 3.0, byEndpoint(t, reg, "outbox_deliveries_total")[[2]string{"", "delivered"}], "the totals by outcome stay")
	for _, name := range []string{"outbox_endpoint_deliveries_total", "outbox_endpoint_delivery_duration_seconds"} {
		require.Equal(t, map[string]bool{okEP.ID.String(): true, refusingEP.ID.String(): true}, endpointsIn(t, reg, name), name)
	}

	// A deleted endpoint's series go (the relay looks every 10 heartbeats,
	// about 10 s); the others' stay.
	_, err := f.admin.DeleteEndpoint(ctx, refusingEP.ID)
	require.NoError(t, err)
	within(t, 30*time.Second, func() bool {
		return !endpointsIn(t, reg, "outbox_endpoint_deliveries_total")[refusingEP.ID.String()]
	}, "the deleted endpoint's series dropped")
	for _, name := range []string{"outbox_endpoint_deliveries_total", "outbox_endpoint_delivery_duration_seconds"} {
		require.Equal(t, map[string]bool{okEP.ID.String(): true}, endpointsIn(t, reg, name), name)
	}
	require.Equal(t, 3.0, byEndpoint(t, reg, "outbox_endpoint_deliveries_total")[[2]string{okEP.ID.String(), "delivered"}])
	require.Equal(t, 3.0, byEndpoint(t, reg, "outbox_deliveries_total")[[2]string{"", "failed"}], "the totals keep its outcomes")

	quiet := start(relay.WithoutEndpointMetrics())
	families, err := quiet.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		require.NotContains(t, fam.GetName(), "outbox_endpoint_", "switched off: no series per endpoint")
	}
}

// The delivery counters and the "message failed" log count only outcomes
// that were recorded: a message whose endpoint was deleted while its
// request was in flight is discarded, its claim gone, and its request's
// failure is not a failed message. Before, every outcome a job had was
// counted and logged, recorded or not, so the metrics disagreed with the
// table.
func TestOnlyRecordedOutcomesAreCounted(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	rc.respond = func(*http.Request, int) int { return http.StatusInternalServerError }
	ep := f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]
	hold := &holdingTransport{
		Transport: &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, 1), release: make(chan struct{}),
	}
	metrics := relay.NewMetrics()
	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg))
	var logs syncBuffer
	cfg := fastConfig()
	cfg.MaxAttempts = 1 // this attempt would fail the message
	rl, err := relay.New(f.pool, cfg, hold, slog.New(slog.NewTextHandler(&logs, nil)), metrics)
	require.NoError(t, err)
	require.NoError(t, rl.Start(ctx))
	require.Equal(t, id, <-hold.sent, "the request is in flight")
	_, err = f.admin.DeleteEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	close(hold.release)
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, rl.Stop(stop), "the job settles")

	require.Equal(t, "discarded", f.status(t, id), "the deletion's settlement stands")
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() == "outbox_deliveries_total" {
			for _, m := range fam.GetMetric() {
				require.Zero(t, m.GetCounter().GetValue(), "nothing was recorded, nothing is counted: %v", m.GetLabel())
			}
		}
	}
	require.NotContains(t, logs.String(), "message failed", "a discarded message is not said to have failed")
}

// syncBuffer is a bytes.Buffer safe for a logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
