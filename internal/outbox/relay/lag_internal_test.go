package relay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A message retried after its receiver asked to wait is counted, from its
// event's writing to its delivery, with the whole wait: the histogram and
// the per-minute sums the ops page reads both put it at least as late as
// the gap between its two requests, which the receiver measured itself,
// and the gap is the 5 seconds or more the receiver asked for.
func TestTheDeliveryLagCountsARetrysWholeWait(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()

	var (
		mu       sync.Mutex
		requests []time.Time
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, time.Now())
		if len(requests) == 1 {
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(receiver.Close)
	var ep uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ($1, 'whsec_AAAA', '{order.placed}') RETURNING id`, receiver.URL).Scan(&ep))
	written := time.Now()
	outboxtest.Seed(t, pool, ep, 1, "")

	r := startRelay(t, pool, nil)
	require.Eventually(t, func() bool {
		var delivered bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT status = 'delivered' FROM outbox_messages WHERE destination = $1`, ep).Scan(&delivered))
		return delivered
	}, 30*time.Second, 50*time.Millisecond)

	mu.Lock()
	require.Len(t, requests, 2, "refused once, delivered at the retry")
	gap := requests[1].Sub(requests[0])
	mu.Unlock()
	require.GreaterOrEqual(t, gap, 5*time.Second, "the retry waited as asked")

	h := histogram(t, r.metrics.deliveryLag.WithLabelValues("webhook", "delivered"))
	require.EqualValues(t, 1, h.GetSampleCount(), "one delivery observed")
	require.GreaterOrEqual(t, h.GetSampleSum(), gap.Seconds(), "its lag holds the retry's wait")
	require.Less(t, h.GetSampleSum(), time.Since(written).Seconds(), "and no more than since its event was written")
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() < 5 {
			require.Zero(t, b.GetCumulativeCount(), "nothing in the buckets under 5 s (le %g)", b.GetUpperBound())
		}
	}
	eh := histogram(t, r.metrics.byEndpointLag.WithLabelValues(ep.String(), "delivered"))
	require.Equal(t, h.GetSampleSum(), eh.GetSampleSum(), "the endpoint's histogram has the same delivery")

	var deliveries int64
	var minMS, maxMS float64
	var le int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(deliveries), min(min_ms), max(max_ms), max(le_ms)
		FROM outbox_delivery_lag_minutes WHERE destination = $1`, ep).Scan(&deliveries, &minMS, &maxMS, &le))
	require.EqualValues(t, 1, deliveries, "one delivery in the minute sums")
	require.Equal(t, minMS, maxMS, "one delivery: its quickest is its latest")
	require.GreaterOrEqual(t, minMS, float64(gap.Milliseconds()), "the sums hold the retry's wait too")
	require.InDelta(t, h.GetSampleSum()*1000, minMS, 50, "the histogram and the sums measure the same lag")
	require.Greater(t, float64(le), minMS, "in the bucket whose bound is above it")
}

func histogram(t *testing.T, o prometheus.Observer) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	require.NoError(t, o.(prometheus.Metric).Write(&m))
	return m.GetHistogram()
}
