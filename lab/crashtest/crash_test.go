package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/proctest"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/webhook"
)

// deliveryTimeout is the suite's: the chaos proxy answers some requests
// past it, and short requests keep the suite short. Everything that
// recovers from a kill (the relay timeout, the claim timeout) is left at its
// default: recovery is what the suite measures.
const deliveryTimeout = 500 * time.Millisecond

// envInt reads a size knob, falling back to def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s", name)
	require.Positive(t, n, "%s", name)
	return n
}

// withAppName tags a connection URL so the connection cutter spares the
// test's own connections, and keeps their number small.
func withAppName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", "crashtest")
	q.Set("pool_max_conns", "2")
	u.RawQuery = q.Encode()
	return u.String()
}

func databaseName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	return strings.TrimPrefix(u.Path, "/")
}

// TestCrash places orders over HTTP while it SIGKILLs and restarts the
// workers and the api, cuts their database connections and makes the
// receiver fail; then, with the chaos stopped and the backlog drained, it
// checks that nothing acknowledged was lost, nothing was invented, and the
// consumer applied every order exactly once.
//
// Size: CRASH_ORDERS orders spread over CRASH_SECONDS seconds of chaos
// (default 900 over 45 s, a CI size), CRASH_WORKERS workers (default 3).
func TestCrash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the crash suite runs real processes for minutes; skipped under -short")
	}
	nOrders := envInt(t, "CRASH_ORDERS", 900)
	seconds := envInt(t, "CRASH_SECONDS", 45)
	nWorkers := envInt(t, "CRASH_WORKERS", 3)
	bin := binaries(t)
	ctx := context.Background()

	ordersDB, consumerDB := dbtest.URL(t), dbtest.URL(t)
	ordersDBName, consumerDBName := databaseName(t, ordersDB), databaseName(t, consumerDB)

	consumerAddr := proctest.FreeAddr(t)
	proxy := newChaosProxy(t, "http://"+consumerAddr+"/webhooks", deliveryTimeout+300*time.Millisecond)

	// The journal: every chaos event and delivery, in order, kept in
	// CRASH_LOG_DIR if set.
	journal := &proctest.Output{}
	t0 := time.Now()
	note := func(format string, args ...any) {
		fmt.Fprintf(journal, "%8.3fs "+format+"\n", append([]any{time.Since(t0).Seconds()}, args...)...)
	}
	proxy.journal = note

	restartSoon := func() time.Duration { return randDuration(0, 500*time.Millisecond) }
	var services []*service
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, s := range services {
			wg.Go(func() { s.stop(15 * time.Second) })
		}
		wg.Wait()
		// CRASH_LOG_DIR keeps every process's log, for a post-mortem.
		if dir := os.Getenv("CRASH_LOG_DIR"); dir != "" {
			for _, s := range services {
				_ = os.WriteFile(filepath.Join(dir, s.name+".log"), []byte(s.logs.String()), 0o644)
			}
			_ = os.WriteFile(filepath.Join(dir, "journal.log"), []byte(journal.String()), 0o644)
		}
	})

	apiAddr := proctest.FreeAddr(t)
	apiURL := "http://" + apiAddr
	api := newService(t, "api", bin+"/api", apiAddr, map[string]string{
		"DATABASE_URL": ordersDB, "API_ADDR": apiAddr, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
	})
	services = append(services, api)
	require.NoError(t, api.supervise(restartSoon))
	api.waitReady(t)

	_, secret := register(t, apiURL, proxy.url)
	// The consumer is mid-rotation: it also accepts a secret being retired.
	retiring, err := webhook.NewSecret()
	require.NoError(t, err)
	cons := newService(t, "consumer", bin+"/consumer", consumerAddr, map[string]string{
		"DATABASE_URL": consumerDB, "CONSUMER_ADDR": consumerAddr, "WEBHOOK_SECRETS": retiring + "," + secret,
	})
	services = append(services, cons)
	require.NoError(t, cons.supervise(restartSoon))
	cons.waitReady(t)

	workers := make([]*service, nWorkers)
	for i := range workers {
		addr := proctest.FreeAddr(t)
		workers[i] = newService(t, fmt.Sprintf("worker-%d", i+1), bin+"/worker", addr, map[string]string{
			"DATABASE_URL": ordersDB, "WORKER_ADDR": addr,
			"OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
			// Chaos fails a quarter of the attempts: retries within a second
			// (not the default schedule's minutes to hours) let the suite
			// drain in time, and a cap this high is never reached, so every
			// message must end delivered.
			"OUTBOX_BACKOFF_BASE":     "10ms",
			"OUTBOX_BACKOFF_MAX":      "500ms",
			"OUTBOX_MAX_ATTEMPTS":     "1000",
			"OUTBOX_DELIVERY_TIMEOUT": deliveryTimeout.String(),
			"WORKER_SHUTDOWN_GRACE":   "1s",
		})
		services = append(services, workers[i])
		require.NoError(t, workers[i].supervise(restartSoon))
	}
	for _, w := range workers {
		w.waitReady(t)
	}

	// The test's own connections, tagged so the cutter spares them.
	ordersPool, err := pgxpool.New(ctx, withAppName(t, ordersDB))
	require.NoError(t, err)
	t.Cleanup(ordersPool.Close)
	consumerPool, err := pgxpool.New(ctx, withAppName(t, consumerDB))
	require.NoError(t, err)
	t.Cleanup(consumerPool.Close)
	adminPool, err := pgxpool.New(ctx, withAppName(t, dbtest.ServerURL()))
	require.NoError(t, err)
	t.Cleanup(adminPool.Close)

	// Chaos.
	var (
		workerKills, workerKillsInFlight atomic.Int64
		apiKills, apiKillsInFlight       atomic.Int64
		cutRounds, cutBackends           atomic.Int64
		maxClaimedAge                    atomic.Int64 // milliseconds
		maxBackends                      atomic.Int64 // of the two databases together
		electionsMu                      sync.Mutex
		elections                        = map[time.Time]bool{} // River leaders seen, by elected_at
		loadInFlight                     atomic.Int64
	)
	chaosCtx, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	var chaos sync.WaitGroup
	proxy.on.Store(true)

	// Workers: one, sometimes two at once, at random moments.
	every(chaosCtx, &chaos, 3*time.Second, 8*time.Second, func() {
		victims := []*service{workers[rand.IntN(len(workers))]}
		if rand.IntN(3) == 0 {
			victims = append(victims, workers[rand.IntN(len(workers))])
		}
		inFlight := proxy.inFlight.Load() > 0
		for _, w := range victims {
			if w.kill() {
				note("SIGKILL %s", w.name)
				workerKills.Add(1)
				if inFlight {
					workerKillsInFlight.Add(1)
				}
			}
		}
	})
	// The api, while order requests are in flight.
	every(chaosCtx, &chaos, 2*time.Second, 5*time.Second, func() {
		inFlight := loadInFlight.Load() > 0
		if api.kill() {
			note("SIGKILL api")
			apiKills.Add(1)
			if inFlight {
				apiKillsInFlight.Add(1)
			}
		}
	})
	// Database connections of the services (api, workers, consumer): a
	// few at random, sometimes every one of a database at once.
	every(chaosCtx, &chaos, 300*time.Millisecond, 1200*time.Millisecond, func() {
		dbName := ordersDBName
		if rand.IntN(4) == 0 {
			dbName = consumerDBName
		}
		limit := 1 + rand.IntN(3)
		if rand.IntN(5) == 0 {
			limit = 1000
		}
		var n int64
		err := adminPool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
				SELECT pid FROM pg_stat_activity
				WHERE datname = $1 AND pid <> pg_backend_pid()
				  AND backend_type = 'client backend' AND application_name <> 'crashtest'
				ORDER BY random() LIMIT $2) victims`, dbName, limit).Scan(&n)
		if err == nil {
			note("terminated %d backends of %s", n, dbName)
			cutRounds.Add(1)
			cutBackends.Add(n)
		}
	})
	// Watch claims (how long does a row stay claimed, at most?) and
	// connections (how many do the services hold, at most?).
	raise := func(v *atomic.Int64, n int64) {
		for old := v.Load(); n > old && !v.CompareAndSwap(old, n); old = v.Load() {
		}
	}
	every(chaosCtx, &chaos, 200*time.Millisecond, 300*time.Millisecond, func() {
		var ms, n int64
		if err := ordersPool.QueryRow(ctx, `
			SELECT coalesce(max(extract(epoch FROM now() - claimed_at) * 1000), 0)::bigint
			FROM outbox_messages WHERE status = 'claimed'`).Scan(&ms); err == nil {
			raise(&maxClaimedAge, ms)
		}
		var elected time.Time
		if err := ordersPool.QueryRow(ctx, `SELECT elected_at FROM river_leader`).Scan(&elected); err == nil {
			electionsMu.Lock()
			elections[elected] = true
			electionsMu.Unlock()
		}
		if err := adminPool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname IN ($1, $2)`,
			ordersDBName, consumerDBName).Scan(&n); err == nil {
			raise(&maxBackends, n)
		}
	})

	// Load: nOrders orders at a steady rate over the chaos period, from 8
	// concurrent clients.
	type acked struct {
		id, customer string
		total        int64
	}
	var (
		mu      sync.Mutex
		acks    []acked
		unknown []string // orders that never got an answer
	)
	start := time.Now()
	interval := time.Duration(seconds) * time.Second / time.Duration(nOrders)
	tickets := make(chan int)
	go func() {
		defer close(tickets)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := range nOrders {
			<-tick.C
			tickets <- i
		}
	}()
	var load sync.WaitGroup
	for range 8 {
		load.Go(func() {
			for i := range tickets {
				qty := 1 + rand.IntN(5)
				price := 100 * (1 + rand.IntN(50))
				customer := fmt.Sprintf("c-%d", i%37)
				body := fmt.Sprintf(`{"customer_id":%q,"lines":[{"sku":"A-%d","quantity":%d,"unit_price_cents":%d}]}`,
					customer, i%11, qty, price)
				loadInFlight.Add(1)
				o, err := placeOrder(ctx, apiURL, uuid.NewString(), body, time.Now().Add(30*time.Second))
				loadInFlight.Add(-1)
				mu.Lock()
				if err != nil {
					unknown = append(unknown, err.Error())
				} else {
					require.EqualValues(t, qty*price, o.TotalCents)
					acks = append(acks, acked{o.ID, o.CustomerID, o.TotalCents})
				}
				mu.Unlock()
			}
		})
	}
	load.Wait()
	note("load done")
	loadTime := time.Since(start)
	stopChaos()
	chaosEnd := time.Now()
	chaos.Wait()
	proxy.on.Store(false)
	note("chaos stopped")
	require.Empty(t, unknown, "orders that never got an answer through the chaos")

	// Drain: every service back up, then the backlog to zero.
	for _, s := range services {
		s.waitReady(t)
	}
	drainStart := time.Now()
	var last outboxStats
	require.Eventually(t, func() bool {
		s, err := getStats(apiURL)
		if err != nil {
			return false
		}
		last = s
		return s.Pending == 0 && s.Claimed == 0
	}, 3*time.Minute, 100*time.Millisecond, "the backlog never drained: last stats %+v", last)
	drainTime := time.Since(drainStart)

	// Gather the evidence.
	final, err := getStats(apiURL)
	require.NoError(t, err)
	var consumerStats struct {
		Applied, Duplicates, BadSignature int64
		StaleTimestamp                    int64 `json:"stale_timestamp"`
		Errors                            int64
	}
	code, body, err := request(http.MethodGet, "http://"+consumerAddr+"/stats", "", nil, &consumerStats)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "body: %s", body)

	committed := map[string]int64{} // order id → total, from the orders table
	rows, err := ordersPool.Query(ctx, "SELECT id::text, total_cents FROM orders")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var total int64
		require.NoError(t, rows.Scan(&id, &total))
		committed[id] = total
	}
	require.NoError(t, rows.Err())
	messages := map[string]bool{}
	rows, err = ordersPool.Query(ctx, "SELECT id::text FROM outbox_messages")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		messages[id] = true
	}
	require.NoError(t, rows.Err())

	applied := map[string]int{} // order id → ledger entries
	inbox := map[string]bool{}
	rows, err = consumerPool.Query(ctx, "SELECT order_id::text, webhook_id FROM consumer_ledger")
	require.NoError(t, err)
	for rows.Next() {
		var orderID, webhookID string
		require.NoError(t, rows.Scan(&orderID, &webhookID))
		applied[orderID]++
		inbox[webhookID] = true
	}
	require.NoError(t, rows.Err())
	var inboxRows int
	require.NoError(t, consumerPool.QueryRow(ctx, "SELECT count(*) FROM consumer_inbox").Scan(&inboxRows))
	var balance, wantBalance int64
	require.NoError(t, consumerPool.QueryRow(ctx, "SELECT coalesce(sum(balance_cents), 0) FROM consumer_customers").Scan(&balance))
	for _, total := range committed {
		wantBalance += total
	}

	var lost, phantom, twice []string
	for _, a := range acks {
		if applied[a.id] == 0 {
			lost = append(lost, a.id)
		}
	}
	for id, n := range applied {
		if _, ok := committed[id]; !ok {
			phantom = append(phantom, id)
		}
		if n > 1 {
			twice = append(twice, id)
		}
	}
	unacked := len(committed) - len(acks) // committed, but the answer died with an api

	var kills, unexpected []string
	for _, s := range services {
		starts, k, u := s.counts()
		kills = append(kills, fmt.Sprintf("%s: %d kills, %d starts", s.name, k, starts))
		for _, why := range u {
			unexpected = append(unexpected, s.name+": "+why)
		}
	}
	slices.Sort(unexpected)

	t.Logf("crash suite: %d orders over %s with %d workers (drained in %s)", nOrders, loadTime.Round(time.Millisecond), nWorkers, drainTime.Round(time.Millisecond))
	t.Logf("  orders acknowledged (201): %d; committed: %d (%d committed while their answer was lost to a kill)", len(acks), len(committed), unacked)
	t.Logf("  worker kills: %d (%d with deliveries in flight); api kills: %d (%d with requests in flight)",
		workerKills.Load(), workerKillsInFlight.Load(), apiKills.Load(), apiKillsInFlight.Load())
	t.Logf("  connection cuts: %d rounds, %d backends terminated", cutRounds.Load(), cutBackends.Load())
	t.Logf("  receiver chaos: %v", proxy.summary())
	// The longest delivery pause: a SIGKILLed worker serving the endpoint
	// holds it until the others declare it dead (the relay timeout, 5 s),
	// and a kill of River's leader (which keeps its lease ~15 s) pauses
	// nothing, as every worker dispatches.
	electionsMu.Lock()
	pause := proxy.longestSilence(start, chaosEnd)
	t.Logf("  longest delivery pause at the receiver during chaos: %s; River leader elections seen: %d",
		pause.Round(time.Millisecond), len(elections))
	electionsMu.Unlock()
	t.Logf("  process exits we did not cause (restarted): %d %v", len(unexpected), unexpected)
	t.Logf("  %s", strings.Join(kills, "; "))
	t.Logf("  longest claim seen during chaos: %s (a claim lives as long as its request); most connections at once: %d",
		time.Duration(maxClaimedAge.Load())*time.Millisecond, maxBackends.Load())
	t.Logf("  outbox at the end: %+v", final)
	t.Logf("  consumer: applied %d, duplicates delivered %d, bad signatures %d, stale %d, errors %d",
		consumerStats.Applied, consumerStats.Duplicates, consumerStats.BadSignature, consumerStats.StaleTimestamp, consumerStats.Errors)
	afterLost, afterAnswer := proxy.duplicateCauses()
	t.Logf("  duplicates by cause: %d after an answer the relay never got, %d after a 2xx the relay got but did not record (killed, or its connection cut)",
		afterLost, afterAnswer)
	t.Logf("  LOST %d, PHANTOM %d, applied twice %d", len(lost), len(phantom), len(twice))

	require.Empty(t, lost, "acknowledged orders never delivered")
	require.Empty(t, phantom, "deliveries for orders that do not exist")
	require.Empty(t, twice, "orders applied more than once")
	require.Len(t, applied, len(committed), "every committed order applied, acknowledged or not")
	require.Equal(t, len(messages), inboxRows, "one inbox row per outbox message")
	for id := range inbox {
		require.True(t, messages[id], "webhook-id %s is not an outbox message id", id)
	}
	require.Equal(t, wantBalance, balance, "customer balances: each order's total counted exactly once")
	require.Equal(t, outboxStats{Delivered: int64(len(messages))}, outboxStats{
		Pending: final.Pending, Claimed: final.Claimed, Delivered: final.Delivered, Failed: final.Failed,
	}, "no row stuck in claimed or pending, none failed")
	require.Zero(t, consumerStats.BadSignature, "every delivery was signed with a secret the consumer holds")
	// The consumer's in-memory "applied" counter is not checked against the
	// ledger: an apply whose commit raced the relay's timeout is committed
	// but answered (and counted) as an error. The database is the truth.
	require.Positive(t, workerKills.Load())
	require.Positive(t, apiKills.Load())
	require.Positive(t, cutBackends.Load())

	// Stop everything gracefully and read the logs: no panic, no secret.
	for _, s := range services {
		s.stop(15 * time.Second)
	}
	for _, s := range services {
		logs := s.logs.String()
		require.NotContains(t, logs, "panic:", "%s panicked:\n%s", s.name, s.logs.Tail(8000))
		require.NotContains(t, logs, secret, "%s logged the webhook secret", s.name)
		require.NotContains(t, logs, retiring, "%s logged a webhook secret", s.name)
		require.NotContains(t, logs, adminToken, "%s logged the admin token", s.name)
	}
}
