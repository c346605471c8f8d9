package crashtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/proctest"
)

// arrivals records when each order's event first reached a receiver, and
// every request per webhook-id (the event id: one endpoint here, so one
// message per event).
type arrivals struct {
	delay time.Duration // before answering 204

	mu       sync.Mutex
	at       map[string]time.Time   // order id → first arrival
	requests map[string][]time.Time // webhook-id (event id) → every request
}

func newArrivals(delay time.Duration) *arrivals {
	return &arrivals{delay: delay, at: map[string]time.Time{}, requests: map[string][]time.Time{}}
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	body, _ := io.ReadAll(r.Body)
	var env struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	a.mu.Lock()
	if json.Unmarshal(body, &env) == nil {
		if _, seen := a.at[env.Data.ID]; !seen {
			a.at[env.Data.ID] = now
		}
	}
	id := r.Header.Get("webhook-id")
	a.requests[id] = append(a.requests[id], now)
	a.mu.Unlock()
	if a.delay > 0 {
		select {
		case <-time.After(a.delay): // the receiver's own slowness
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *arrivals) get(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[id]
	return t, ok
}

// hanging accepts requests and never answers: the relay gives up at its
// delivery timeout.
func hanging(t *testing.T, requests *atomic.Int64) string {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	return srv.URL + "/hook"
}

// refusing returns the URL of a port that was just closed: connections to
// it are refused.
func refusing(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String() + "/hook"
	require.NoError(t, ln.Close())
	return url
}

// TestHeadOfLine measures the isolation promise at the default settings,
// as a new user runs the service: cmd/api and cmd/worker (the real
// binaries) with nothing but addresses set. A healthy endpoint's
// commit-to-delivery latency is measured alone, then beside one hanging and
// one refusing endpoint, then beside ten failing ones, every endpoint
// receiving every order at HOL_RATE orders/s (default 50) for HOL_SECONDS
// (default 60) per phase. The healthy p99 must stay within twice its
// baseline plus 100 ms, no healthy message may fail or go missing, and each
// failing endpoint must back off as a whole, its waiting messages spending
// no attempts.
//
// It is not parallel: it measures latency, and on a 2-core machine sharing
// the CPU with the crash suite's chaos would measure the chaos instead.
func TestHeadOfLine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes for about three minutes; skipped under -short")
	}
	seconds := envInt(t, "HOL_SECONDS", 60)
	rate := envInt(t, "HOL_RATE", 50)
	bin := binaries(t)
	ctx := context.Background()
	dbURL := dbtest.URL(t)

	healthy := newArrivals(0)
	healthySrv := httptest.NewServer(healthy)
	t.Cleanup(healthySrv.Close)

	apiAddr, workerAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	apiURL := "http://" + apiAddr
	api := newService(t, "api", bin+"/api", apiAddr, map[string]string{
		"DATABASE_URL": dbURL, "API_ADDR": apiAddr, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
	})
	// The worker at its defaults: only where to listen, and that loopback
	// receivers are allowed.
	worker := newService(t, "worker", bin+"/worker", workerAddr, map[string]string{
		"DATABASE_URL": dbURL, "WORKER_ADDR": workerAddr, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
	})
	for _, s := range []*service{api, worker} {
		require.NoError(t, s.start())
		t.Cleanup(func() { s.stop(20 * time.Second) })
	}
	api.waitReady(t)
	worker.waitReady(t)
	healthyID, _ := register(t, apiURL, `"url":"`+healthySrv.URL+`/hook"`)

	// phase places orders at a steady rate for d and returns each order's
	// commit-to-delivery latency at the healthy endpoint: from the moment
	// its 201 arrived (the commit precedes the answer) to the moment the
	// event did.
	phase := func(name string, d time.Duration) []time.Duration {
		t.Helper()
		committed := map[string]time.Time{}
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for end := time.Now().Add(d); time.Now().Before(end); {
			<-tick.C
			o, err := placeOrder(ctx, apiURL, uuid.NewString(),
				`{"customer_id":"c-hol","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":100}]}`, time.Now().Add(10*time.Second))
			require.NoError(t, err)
			committed[o.ID] = time.Now()
		}
		var lat []time.Duration
		require.Eventually(t, func() bool {
			lat = lat[:0]
			for id, at := range committed {
				arrived, ok := healthy.get(id)
				if !ok {
					return false
				}
				lat = append(lat, max(arrived.Sub(at), 0))
			}
			return true
		}, 60*time.Second, 50*time.Millisecond, "%s: the healthy endpoint never got every order", name)
		slices.Sort(lat)
		return lat
	}
	p := func(lat []time.Duration, q float64) time.Duration { return percentile(lat, q).Round(time.Millisecond) }
	logPhase := func(label string, lat []time.Duration) {
		t.Logf("  %-40s p50 %s, p95 %s, p99 %s, max %s (%d orders)", label, p(lat, .5), p(lat, .95), p(lat, .99), p(lat, 1), len(lat))
	}

	phase("warm-up", 2*time.Second)
	baselineSeconds := max(seconds/2, 5)
	baseline := phase("baseline", time.Duration(baselineSeconds)*time.Second)
	// The bound: twice the baseline p99 plus 100 ms. The absolute part is
	// there because the baseline p99 is itself about a poll interval (50 ms)
	// plus a few milliseconds: at that scale one scheduling hiccup of a
	// 2-core machine (PostgreSQL, both processes and this test share it, and
	// the failing phases do more work) moves a p99 by tens of milliseconds
	// without any head-of-line blocking. Blocking behind a hanging endpoint
	// would cost its 10 s delivery timeout, far above the bound.
	bound := 2*percentile(baseline, .99) + 100*time.Millisecond

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var hangingRequests atomic.Int64
	var failing []string
	addFailing := func(hangingN, refusingN int) {
		for range hangingN {
			id, _ := register(t, apiURL, `"url":"`+hanging(t, &hangingRequests)+`"`)
			failing = append(failing, id)
		}
		for range refusingN {
			id, _ := register(t, apiURL, `"url":"`+refusing(t)+`"`)
			failing = append(failing, id)
		}
	}

	addFailing(1, 1)
	outage := phase("1 hanging, 1 refusing", time.Duration(seconds)*time.Second)
	addFailing(4, 4)
	outage10 := phase("5 hanging, 5 refusing", time.Duration(seconds)*time.Second)

	t.Logf("head-of-line at the defaults, healthy endpoint, commit-to-delivery at %d orders/s, every endpoint subscribed:", rate)
	logPhase("alone (baseline, "+fmt.Sprint(baselineSeconds)+" s):", baseline)
	logPhase("beside 1 hanging + 1 refusing ("+fmt.Sprint(seconds)+" s):", outage)
	logPhase("beside 5 hanging + 5 refusing ("+fmt.Sprint(seconds)+" s):", outage10)
	t.Logf("  bound for p99: 2 x baseline p99 + 100 ms = %s", bound.Round(time.Millisecond))
	require.LessOrEqual(t, percentile(outage, .99), bound,
		"beside 2 failing endpoints the healthy p99 exceeds 2 x baseline p99 + 100 ms")
	require.LessOrEqual(t, percentile(outage10, .99), bound,
		"beside 10 failing endpoints the healthy p99 exceeds 2 x baseline p99 + 100 ms")

	// Outcomes are recorded within a poll interval of the answer.
	var healthyLeft, healthyFailed int
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status <> 'delivered'), count(*) FILTER (WHERE status = 'failed')
			FROM outbox_messages WHERE destination = $1`, healthyID).Scan(&healthyLeft, &healthyFailed))
		return healthyLeft == 0
	}, 5*time.Second, 20*time.Millisecond, "every healthy message is recorded delivered")
	require.Zero(t, healthyFailed, "no healthy message failed")

	// Each failing endpoint backs off as a whole: its messages wait, none
	// delivered, none failed, and only the requests in flight when it began
	// failing and its probes cost an attempt.
	for _, id := range failing {
		var url, health string
		var total, delivered, failed, attempted, attempts, maxAttempts int
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT e.url, e.health,
			       count(m.*), count(*) FILTER (WHERE m.status = 'delivered'), count(*) FILTER (WHERE m.status = 'failed'),
			       count(*) FILTER (WHERE m.attempts > 0), coalesce(sum(m.attempts), 0), coalesce(max(m.attempts), 0)
			FROM webhook_endpoints e LEFT JOIN outbox_messages m ON m.destination = e.id
			WHERE e.id = $1 GROUP BY e.url, e.health`, id).
			Scan(&url, &health, &total, &delivered, &failed, &attempted, &attempts, &maxAttempts))
		t.Logf("  %s: %s; %d messages waiting, %d tried (%d attempts, at most %d on one), %d delivered, %d failed",
			url, health, total-delivered-failed, attempted, attempts, maxAttempts, delivered, failed)
		require.Equal(t, "backing_off", health, "%s backs off as a whole", url)
		require.Zero(t, delivered)
		require.Zero(t, failed, "a day's retry schedule: nothing fails within minutes")
		// The requests in flight when it began failing, the slots freed by
		// the failures before the threshold, then one probe at 5, 10, 20,
		// 40, 60, 60… s (fewer than one per 5 s): a few dozen, not one per
		// message.
		cfg := relay.DefaultConfig()
		most := cfg.DestinationConcurrency + cfg.CircuitThreshold - 1 + 2*seconds/5
		require.LessOrEqual(t, attempts, most, "%s: waiting behind the open circuit spends no attempts (%d messages)", url, total)
	}
	t.Logf("  the hanging endpoints received %d requests in all", hangingRequests.Load())
}

// TestRecoveryAfterSIGKILL kills the worker holding claims, with requests in
// flight to a slow receiver, and measures how soon a second worker delivers
// what it held, at the default settings: within 10 seconds. The messages
// delivered twice must be exactly ones the killed worker had sent before it
// died: nothing else is duplicated.
func TestRecoveryAfterSIGKILL(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs real processes; skipped under -short")
	}
	bin := binaries(t)
	ctx := context.Background()
	dbURL := dbtest.URL(t)
	receiver := newArrivals(500 * time.Millisecond)
	srv := httptest.NewServer(receiver)
	t.Cleanup(srv.Close)

	apiAddr := proctest.FreeAddr(t)
	apiURL := "http://" + apiAddr
	api := newService(t, "api", bin+"/api", apiAddr, map[string]string{
		"DATABASE_URL": dbURL, "API_ADDR": apiAddr, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
	})
	require.NoError(t, api.start())
	t.Cleanup(func() { api.stop(20 * time.Second) })
	api.waitReady(t)
	workers := make([]*service, 2)
	for i := range workers {
		addr := proctest.FreeAddr(t)
		name := fmt.Sprintf("worker-%d", i+1)
		workers[i] = newService(t, name, bin+"/worker", addr, map[string]string{
			"DATABASE_URL": withApplicationName(t, dbURL, "crashtest-"+name), "WORKER_ADDR": addr, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
		})
		require.NoError(t, workers[i].start())
		t.Cleanup(func() { workers[i].stop(20 * time.Second) })
		workers[i].waitReady(t)
	}
	register(t, apiURL, `"url":"`+srv.URL+`/hook"`)

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const n = 40
	for range n {
		_, err := placeOrder(ctx, apiURL, uuid.NewString(),
			`{"customer_id":"c-rec","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":100}]}`, time.Now().Add(10*time.Second))
		require.NoError(t, err)
	}

	// Wait until one worker holds claims with requests in flight, then kill
	// it.
	var holderPID int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT r.pid FROM outbox_messages m JOIN outbox_relays r ON r.id = m.claimed_by
			WHERE m.status = 'claimed' LIMIT 1`).Scan(&holderPID)
		return err == nil
	}, 30*time.Second, 5*time.Millisecond, "no worker ever held claims")
	var victim *service
	for _, w := range workers {
		if w.pid() == holderPID {
			victim = w
		}
	}
	require.NotNil(t, victim, "the claims belong to one of the two workers (pid %d)", holderPID)
	var victimRelay uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox_relays WHERE pid = $1`, holderPID).Scan(&victimRelay))
	require.True(t, victim.kill())
	killedAt := time.Now()
	// What the dead worker held is known once its database sessions are
	// gone: a statement it sent just before the kill (a claim, a record)
	// still runs to its end on the server. Its claims are then still
	// claimed by it, or already released as interrupted if the survivor
	// declared it dead meanwhile.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, "crashtest-"+victim.name).Scan(&n))
		return n == 0
	}, 10*time.Second, 5*time.Millisecond, "the killed worker's sessions ended")
	var held []string
	rows, err := pool.Query(ctx, `SELECT id::text FROM outbox_messages WHERE status = 'claimed' AND claimed_by = $1
		UNION SELECT message_id::text FROM outbox_attempts WHERE outcome = 'interrupted'`, victimRelay)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		held = append(held, id)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, held, "the killed worker held claims")

	// The survivor delivers what the dead worker held.
	deliveredAll := func(ids []string) bool {
		var left int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE id::text = ANY ($1) AND status <> 'delivered'`,
			ids).Scan(&left))
		return left == 0
	}
	require.Eventually(t, func() bool { return deliveredAll(held) }, 10*time.Second, 10*time.Millisecond,
		"the killed worker's %d claims were not delivered within 10 s of the kill", len(held))
	recovered := time.Since(killedAt)
	var all []string
	rows, err = pool.Query(ctx, `SELECT id::text FROM outbox_messages`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		all = append(all, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, all, n)
	require.Eventually(t, func() bool { return deliveredAll(all) }, 30*time.Second, 10*time.Millisecond, "every message delivered")
	drained := time.Since(killedAt)

	// The receiver saw each event under its id: webhook-id is the event id
	// of the one message per event (one endpoint).
	var events []string
	rows, err = pool.Query(ctx, `SELECT event_id::text FROM outbox_messages`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		events = append(events, id)
	}
	require.NoError(t, rows.Err())
	receiver.mu.Lock()
	received := make([]string, 0, len(receiver.requests))
	for id := range receiver.requests {
		received = append(received, id)
	}
	receiver.mu.Unlock()
	require.ElementsMatch(t, events, received, "the webhook-ids received are the messages' event ids")

	// Duplicates only where the dead worker had already sent the request.
	receiver.mu.Lock()
	var duplicates, sentBeforeKill int
	for id, reqs := range receiver.requests {
		if reqs[0].Before(killedAt) {
			sentBeforeKill++
		}
		if len(reqs) > 1 {
			duplicates++
			require.True(t, reqs[0].Before(killedAt), "event %s was delivered twice but first sent %s after the kill", id, reqs[0].Sub(killedAt))
		}
		require.LessOrEqual(t, len(reqs), 2, "event %s sent %d times", id, len(reqs))
	}
	receiver.mu.Unlock()
	var interrupted int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts WHERE outcome = 'interrupted'`).Scan(&interrupted))
	t.Logf("SIGKILL of the worker holding %d claims (receiver answers in 500 ms), defaults: its claims delivered by the other worker %s after the kill, all %d messages %s after it",
		len(held), recovered.Round(time.Millisecond), n, drained.Round(time.Millisecond))
	t.Logf("  requests the dead worker had sent: %d; delivered twice: %d (each sent before the kill); attempts recorded as interrupted: %d",
		sentBeforeKill, duplicates, interrupted)
	require.Equal(t, len(held), interrupted, "each claim cut off by the death is on record as an interrupted attempt")
}
