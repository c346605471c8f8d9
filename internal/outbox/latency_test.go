package outbox_test

import (
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/stretchr/testify/require"
)

// Commit-to-delivery latency with the default settings, one message at a
// time to an idle relay: the bound the README promises is the poll interval
// plus the delivery time. The figures are logged (go test -v -run Latency).
func TestLatencyIdleRelayWithDefaults(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	arrived := make(chan time.Time, 1)
	rc.respond = func(*http.Request, int) int {
		arrived <- time.Now()
		return http.StatusNoContent
	}
	f.endpoint(t, rc, "order.placed")
	cfg := relay.DefaultConfig()
	f.startRelay(t, cfg, nil)

	// Warm up: River's maintenance services start with a short stagger.
	f.enqueue(t, "order.placed", "warm-up")
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("warm-up message never arrived")
	}

	var mu sync.Mutex
	var lat []time.Duration
	for i := range 30 {
		committed := time.Now()
		f.enqueue(t, "order.placed", i)
		select {
		case at := <-arrived:
			mu.Lock()
			lat = append(lat, at.Sub(committed))
			mu.Unlock()
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d not delivered within 10s", i)
		}
		// Spread commits over the poll cycle rather than aligning with it.
		time.Sleep(time.Duration(i%7) * 23 * time.Millisecond)
	}
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	t.Logf("commit-to-delivery, idle relay, poll %s: p50 %s, p95 %s, max %s",
		cfg.PollInterval, p(.5), p(.95), lat[len(lat)-1])
	require.Less(t, p(.95), cfg.PollInterval+500*time.Millisecond,
		"an idle relay delivers within the poll interval plus delivery time")
}
