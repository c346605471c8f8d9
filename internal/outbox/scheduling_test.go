package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/proctest"
)

// concurrency is a receiver that counts the requests it has in flight at
// once, answering each after delay.
type concurrency struct {
	delay time.Duration
	// fill, when set, holds every request (up to holdAtMost) until fill
	// requests have been in flight at once: on a loaded machine the first
	// requests could otherwise end before the last of a claim's begin, and
	// most would say less than the relay did.
	fill      int64
	filled    chan struct{}
	fillOnce  sync.Once
	now, most atomic.Int64
	served    atomic.Int64
	mu        sync.Mutex
	byEventID map[string]int
}

// holdAtMost bounds how long concurrency holds a request waiting for the
// others (fill).
const holdAtMost = 3 * time.Second

func (c *concurrency) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.now.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	if c.fill > 0 {
		if n >= c.fill {
			c.fillOnce.Do(func() { close(c.filled) })
		}
		select {
		case <-c.filled:
		case <-time.After(holdAtMost):
		}
	}
	time.Sleep(c.delay) // the receiver's own work
	c.now.Add(-1)
	c.mu.Lock()
	c.byEventID[r.Header.Get("webhook-id")]++
	c.mu.Unlock()
	c.served.Add(1)
	w.WriteHeader(http.StatusNoContent)
}

// One destination never has more than DestinationConcurrency requests in
// flight, however many relays run and however deep its backlog, and it
// does use them all: at the defaults, two relays, 300 messages.
func TestDestinationConcurrencyIsBoundedAcrossRelays(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	limit := int64(relay.DefaultConfig().DestinationConcurrency)
	rc := &concurrency{delay: 30 * time.Millisecond, fill: limit, filled: make(chan struct{}), byEventID: map[string]int{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	ep, err := f.admin.CreateEndpoint(ctx, srv.URL, []string{"order.placed"})
	require.NoError(t, err)
	outboxtest.Seed(t, f.pool, ep.ID, 300, "")
	f.startRelay(t, relay.Config{}, nil)
	f.startRelay(t, relay.Config{}, nil)

	eventually(t, func() bool { return rc.served.Load() == 300 }, "every message delivered")
	require.LessOrEqual(t, rc.most.Load(), limit, "never more requests in flight to one destination than its concurrency")
	require.Equal(t, limit, rc.most.Load(), "and the destination gets all of them")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Len(t, rc.byEventID, 300)
	for id, n := range rc.byEventID {
		require.Equal(t, 1, n, "message %s sent %d times", id, n)
	}
}

// A claim lasts about as long as its request: a slow destination's
// backlog is not claimed while it waits, only what is in flight and the
// few windows claimed ahead to go next (the next claim's round trip
// overlaps the requests), so no claim outlives its request by more than
// the requests queued before it, and every message is sent exactly once.
func TestClaimsLastAsLongAsTheirRequest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := &concurrency{delay: 300 * time.Millisecond, byEventID: map[string]int{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	_, err := f.admin.CreateEndpoint(ctx, srv.URL, []string{"order.placed"})
	require.NoError(t, err)
	for i := range 64 {
		f.enqueue(t, "order.placed", i)
	}
	f.startRelay(t, relay.Config{}, nil)

	var oldest time.Duration
	var claimedMost int
	for rc.served.Load() < 64 {
		var ms float64
		var claimed int
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT coalesce(max(extract(epoch FROM now() - claimed_at)) * 1000, 0), count(*)
			FROM outbox_messages WHERE status = 'claimed'`).Scan(&ms, &claimed))
		oldest = max(oldest, time.Duration(ms*float64(time.Millisecond)))
		claimedMost = max(claimedMost, claimed)
		time.Sleep(20 * time.Millisecond) // a sampling interval
	}
	cfg := relay.DefaultConfig()
	t.Logf("64 messages at 300 ms each: at most %d claimed at once, the oldest claim %s old", claimedMost, oldest)
	// In flight, claimed ahead (four windows in all, at most), and
	// answered awaiting the next record (every poll interval): never the
	// waiting backlog. A window starts at two and doubles per round of
	// answers, so a claim made ahead waits two rounds at most.
	require.LessOrEqual(t, claimedMost, 4*cfg.DestinationConcurrency, "only what is in flight or claimed ahead is claimed")
	require.Less(t, claimedMost, 64, "the backlog waits unclaimed")
	require.Less(t, oldest, 3*300*time.Millisecond+3*cfg.PollInterval+200*time.Millisecond,
		"a claim lives for its request, the few requests before it, and its record: not for the backlog's wait")
	var timeouts, tried int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_attempts WHERE outcome <> 'delivered'),
		(SELECT count(*) FROM outbox_messages WHERE attempts <> 1)`).Scan(&timeouts, &tried))
	require.Zero(t, timeouts)
	eventually(t, func() bool {
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE attempts <> 1 OR status <> 'delivered'`).Scan(&tried))
		return tried == 0
	}, "each message delivered on its one and only attempt")
}

// One slow request does not hold the others' outcomes: they are recorded
// as they come, while it is still in flight.
func TestOutcomesAreRecordedAsTheyHappen(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	release := make(chan struct{})
	var slowID atomic.Value
	rc.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, _ := slowID.Load().(string); r.Header.Get("webhook-id") == id {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
	t.Cleanup(func() { close(release) })
	f.endpoint(t, rc, "order.placed")
	slow := f.enqueue(t, "order.placed", "slow")[0]
	slowID.Store(f.event(t, slow).String())
	var fast []uuid.UUID
	for i := range 10 {
		fast = append(fast, f.enqueue(t, "order.placed", i)...)
	}
	f.startRelay(t, relay.Config{}, nil)
	for _, id := range fast {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "recorded while the slow one is in flight")
	}
	require.Equal(t, outbox.StatusClaimed, f.status(t, slow), "the slow request is still in flight")
}

// A destination's state changes are said once each: one warning when it
// starts backing off (with the error), however many probes fail after,
// and one line when it recovers; and counted in the metrics.
func TestDestinationStateChangesAreLoggedOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	down := rc.failing(http.StatusBadGateway)
	ep := f.endpoint(t, rc, "order.placed")
	for i := range 20 {
		f.enqueue(t, "order.placed", i)
	}
	var logs proctest.Output
	metrics := relay.NewMetrics()
	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg))
	rl, err := relay.New(f.pool, relay.Config{},
		&relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		slog.New(slog.NewJSONHandler(&logs, nil)), metrics)
	require.NoError(t, err)
	require.NoError(t, rl.Start(ctx))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = rl.Stop(c)
	})

	// Backing off, then at least one failed probe (after 5 s).
	within(t, 20*time.Second, func() bool {
		got, err := f.admin.Endpoint(ctx, ep.ID)
		require.NoError(t, err)
		return got.State == outbox.HealthBackingOff && got.ConsecutiveFailures > relay.DefaultConfig().CircuitThreshold
	}, "a probe failed")
	down.Store(false)
	// Probe now, as the ops page's button does, rather than wait out the
	// doubled wait.
	_, err = f.admin.SetEndpointEnabled(ctx, ep.ID, true)
	require.NoError(t, err)
	within(t, 10*time.Second, func() bool {
		got, err := f.admin.Endpoint(ctx, ep.ID)
		require.NoError(t, err)
		return got.State == outbox.HealthHealthy
	}, "recovered")

	lines := func(msg string) []map[string]any {
		var out []map[string]any
		for l := range strings.SplitSeq(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == msg {
				out = append(out, rec)
			}
		}
		return out
	}
	// The recovery is logged just after it is stored.
	within(t, 5*time.Second, func() bool { return len(lines("destination recovered")) > 0 }, "the recovery is logged")
	failing := lines("destination failing: backing off as a whole")
	require.Len(t, failing, 1, "logs:\n%s", logs.String())
	require.Equal(t, ep.ID.String(), failing[0]["destination"])
	require.Contains(t, failing[0]["error"], "502 Bad Gateway")
	require.Len(t, lines("destination recovered"), 1, "logs:\n%s", logs.String())

	families, err := reg.Gather()
	require.NoError(t, err)
	changes := map[string]float64{}
	for _, fam := range families {
		if fam.GetName() == "outbox_destination_state_changes_total" {
			for _, m := range fam.GetMetric() {
				changes[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, map[string]float64{outbox.HealthBackingOff: 1, outbox.HealthHealthy: 1}, changes)
}

// GET /webhook-endpoints/{id} says how a destination is doing: its state,
// since when and why, and its next probe while it backs off.
func TestEndpointStateIsInTheAPI(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	_, err := f.pool.Exec(ctx, `UPDATE webhook_endpoints SET health = 'backing_off', health_reason = 'connect: connection refused',
		health_changed_at = now() - interval '1 minute', consecutive_failures = 6, backoff_until = now() + interval '10 seconds'
		WHERE id = $1`, ep.ID)
	require.NoError(t, err)
	get := func() map[string]any {
		req := httptest.NewRequest(http.MethodGet, "/webhook-endpoints/"+ep.ID.String(), nil)
		w := httptest.NewRecorder()
		f.admin.Handler().ServeHTTP(w, req)
		require.Equal(t, http.StatusOK, w.Code)
		var got map[string]any
		require.NoError(t, json.NewDecoder(bytes.NewReader(w.Body.Bytes())).Decode(&got))
		return got
	}
	got := get()
	require.Equal(t, "backing_off", got["state"])
	require.Equal(t, "connect: connection refused", got["state_reason"])
	require.EqualValues(t, 6, got["consecutive_failures"])
	require.NotEmpty(t, got["next_probe_at"])
	require.NotEmpty(t, got["state_since"])

	_, err = f.admin.SetEndpointEnabled(ctx, ep.ID, false)
	require.NoError(t, err)
	got = get()
	require.Equal(t, "paused", got["state"])
	require.Equal(t, "disabled by an operator", got["state_reason"])
}

// Probe now probes at once even when every waiting message was tried in
// the outage and its own retry is far off: the probe takes the message due
// first. Before, the button only ended the endpoint's backoff, and the
// probe waited for that retry (up to hours after a long outage).
func TestProbeNowSendsAMessageWhoseRetryIsLater(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]
	// The outage: the message tried twice, its retry 10 minutes off, and
	// the endpoint backing off as a whole.
	_, err := f.pool.Exec(ctx, `UPDATE outbox_messages SET attempts = 2, last_error = '502 Bad Gateway',
		next_attempt_at = now() + interval '10 minutes' WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE webhook_endpoints SET health = 'backing_off', health_reason = '502 Bad Gateway',
		health_changed_at = now() - interval '1 minute', consecutive_failures = 6, backoff_until = now() + interval '1 minute'
		WHERE id = $1`, ep.ID)
	require.NoError(t, err)
	f.startRelay(t, relay.Config{}, nil)

	_, err = f.admin.SetEndpointEnabled(ctx, ep.ID, true)
	require.NoError(t, err)
	within(t, 10*time.Second, func() bool { return f.status(t, id) == outbox.StatusDelivered },
		"probed at once, not at its retry 10 minutes away")
	got, err := f.admin.Endpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthHealthy, got.State, "the probe's answer closes the circuit")
}
