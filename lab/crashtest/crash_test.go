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
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
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

// TestCrash places orders over HTTP, and cancels about a third of them as
// soon as they are acknowledged, while it SIGKILLs and restarts the workers
// and the api, cuts their database connections and makes the receiver fail;
// then, with the chaos stopped and the backlog drained, it checks that
// nothing acknowledged was lost, nothing was invented, the consumer applied
// every event exactly once, and per-key order held: the consumer's endpoint
// takes both order.placed and order.cancelled, and no order.cancelled
// reached it before its order's order.placed had been delivered.
//
// Size: CRASH_ORDERS orders spread over CRASH_SECONDS seconds of chaos
// (default 900 over 45 s, a CI size), CRASH_WORKERS workers (default 3).
func TestCrash(t *testing.T) {
	t.Parallel()
	crashSuite(t, false)
}

// TestCrashJetStream is TestCrash with the consumer behind NATS JetStream:
// the consumer's endpoint is a JetStream subject, the workers publish to
// it (Nats-Msg-Id = event id, waiting for the stream's ack), and the
// consumer reads it with a durable pull consumer, acking after its commit.
// The chaos is the same, but for the receiver's: instead of a failing HTTP
// receiver, the consumer process is SIGKILLed at random moments, so
// JetStream redelivers what it was applying. The verdict is the same: lost
// 0, phantom 0, every event applied once, per-key order kept.
func TestCrashJetStream(t *testing.T) {
	t.Parallel()
	crashSuite(t, true)
}

// crashSuite is the crash suite, to the consumer over webhooks or, with
// viaJetStream, over NATS JetStream.
func crashSuite(t *testing.T, viaJetStream bool) {
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
	var stream jetStream
	if viaJetStream {
		stream = newJetStream(t)
	}

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

	destination := `"url":"` + proxy.url + `"`
	if viaJetStream {
		destination = `"kind":"nats","subject":"` + stream.subject + `"`
	}
	endpointID, secret := register(t, apiURL, destination)
	// The consumer is mid-rotation: it also accepts a secret being retired.
	retiring, err := webhook.NewSecret()
	require.NoError(t, err)
	consumerEnv := map[string]string{
		"DATABASE_URL": consumerDB, "CONSUMER_ADDR": consumerAddr, "WEBHOOK_SECRETS": retiring + "," + secret,
	}
	if viaJetStream {
		consumerEnv["NATS_URL"], consumerEnv["NATS_STREAM"] = stream.url, stream.name
	}
	cons := newService(t, "consumer", bin+"/consumer", consumerAddr, consumerEnv)
	services = append(services, cons)
	require.NoError(t, cons.supervise(restartSoon))
	cons.waitReady(t)

	workers := make([]*service, nWorkers)
	for i := range workers {
		addr := proctest.FreeAddr(t)
		env := map[string]string{
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
		}
		if viaJetStream {
			env["OUTBOX_NATS_URL"] = stream.url
		}
		workers[i] = newService(t, fmt.Sprintf("worker-%d", i+1), bin+"/worker", addr, env)
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
	proxy.on.Store(!viaJetStream)
	var consumerKills atomic.Int64
	if viaJetStream {
		// The receiver's chaos: the consumer dies mid-stream, and JetStream
		// redelivers what it had not acked.
		every(chaosCtx, &chaos, 2*time.Second, 6*time.Second, func() {
			if cons.kill() {
				note("SIGKILL consumer")
				consumerKills.Add(1)
			}
		})
	}

	// Workers: one, sometimes two at once, at random moments.
	every(chaosCtx, &chaos, 3*time.Second, 8*time.Second, func() {
		victims := []*service{workers[rand.IntN(len(workers))]}
		if rand.IntN(3) == 0 {
			victims = append(victims, workers[rand.IntN(len(workers))])
		}
		inFlight := proxy.inFlight.Load() > 0 || stream.pending() > 0
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
	// concurrent clients. A third of them are cancelled as soon as their
	// placement is acknowledged, so the order.cancelled is committed while
	// its order.placed is often still on its way (or being retried through
	// the chaos): per-key order has to hold it back.
	type acked struct {
		id, customer string
		total        int64
	}
	var (
		mu             sync.Mutex
		acks           []acked
		cancelAcks     []string // orders whose cancellation was answered 200
		unknown        []string // orders that never got an answer
		unknownCancels []string // cancellations that never got an answer
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
				if err != nil || i%3 != 0 {
					continue
				}
				loadInFlight.Add(1)
				err = cancelOrder(ctx, apiURL, o.ID, time.Now().Add(30*time.Second))
				loadInFlight.Add(-1)
				mu.Lock()
				if err != nil {
					unknownCancels = append(unknownCancels, err.Error())
				} else {
					cancelAcks = append(cancelAcks, o.ID)
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
	require.Empty(t, unknownCancels, "cancellations that never got an answer through the chaos")

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
	if viaJetStream {
		// And the consumer has settled every message: what a killed
		// consumer held comes back after the consumer's ack wait (30 s),
		// and one it refused (its database cut, a cancel before its
		// placement) after its redelivery delay, which doubles with each
		// refusal up to 5 minutes: after a few unlucky refusals in the
		// chaos, minutes. Two minutes were not always enough.
		var info *jetstream.ConsumerInfo
		if !assert.Eventually(t, func() bool {
			info = stream.consumerInfo()
			return info != nil && info.NumPending == 0 && info.NumAckPending == 0
		}, 6*time.Minute, 100*time.Millisecond) {
			// What it was waiting for, and whether the consumer still ran.
			if info == nil {
				t.Fatalf("the JetStream consumer never settled: its info could not be read")
			}
			t.Fatalf("the JetStream consumer never settled: %d pending, %d delivered and not acked, %d redelivered; consumer ready: %v; its logs:\n%s",
				info.NumPending, info.NumAckPending, info.NumRedelivered, cons.ready(), tail(cons.logs.String(), 4000))
		}
	}
	drainTime := time.Since(drainStart)

	// Gather the evidence.
	final, err := getStats(apiURL)
	require.NoError(t, err)
	var consumerStats struct {
		Applied        int64 `json:"applied"`
		Duplicates     int64 `json:"duplicates"`
		BadSignature   int64 `json:"bad_signature"`
		StaleTimestamp int64 `json:"stale_timestamp"`
		OutOfOrder     int64 `json:"out_of_order"`
		Errors         int64 `json:"errors"`
	}
	code, body, err := request(http.MethodGet, "http://"+consumerAddr+"/stats", "", nil, &consumerStats)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "body: %s", body)

	committed := map[string]int64{} // order id → total, from the orders table
	cancelled := map[string]bool{}  // order id → its status is 'cancelled'
	rows, err := ordersPool.Query(ctx, "SELECT id::text, total_cents, status FROM orders")
	require.NoError(t, err)
	for rows.Next() {
		var id, status string
		var total int64
		require.NoError(t, rows.Scan(&id, &total, &status))
		committed[id] = total
		if status == "cancelled" {
			cancelled[id] = true
		}
	}
	require.NoError(t, rows.Err())
	// The events: one order.placed per committed order and one
	// order.cancelled per cancelled one, each written with its change.
	type event struct{ typ, orderID string }
	events := map[string]event{}     // event id → what it says about which order
	eventsOf := map[event][]string{} // (type, order) → event ids
	var unkeyed []string             // events not keyed by their order's id
	rows, err = ordersPool.Query(ctx, "SELECT id::text, type, payload->>'id', coalesce(ordering_key, '') FROM outbox_events")
	require.NoError(t, err)
	for rows.Next() {
		var id, key string
		var ev event
		require.NoError(t, rows.Scan(&id, &ev.typ, &ev.orderID, &key))
		events[id] = ev
		eventsOf[ev] = append(eventsOf[ev], id)
		if key != ev.orderID {
			unkeyed = append(unkeyed, fmt.Sprintf("%s %s (key %q)", ev.typ, id, key))
		}
	}
	require.NoError(t, rows.Err())
	// Cancellations committed while their order.placed was not yet
	// delivered: the ones per-key order had to hold back.
	var heldBack int
	require.NoError(t, ordersPool.QueryRow(ctx, `
		SELECT count(*) FROM outbox_events c
		JOIN outbox_events p ON p.ordering_key = c.ordering_key AND p.type = 'order.placed'
		JOIN outbox_messages pm ON pm.event_id = p.id AND pm.destination = $1
		WHERE c.type = 'order.cancelled' AND c.created_at < pm.delivered_at`, endpointID).Scan(&heldBack))
	// The deliveries to the consumer's endpoint, by event: a webhook-id is
	// an event id, and the consumer's dedup key. The endpoint was
	// subscribed before the first order, so every event has one.
	deliveries := map[string]int{} // event id → messages to the consumer
	var messages int
	rows, err = ordersPool.Query(ctx, "SELECT event_id::text FROM outbox_messages WHERE destination = $1", endpointID)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		deliveries[id]++
		messages++
	}
	require.NoError(t, rows.Err())
	var allMessages int
	require.NoError(t, ordersPool.QueryRow(ctx, "SELECT count(*) FROM outbox_messages").Scan(&allMessages))

	// The consumer's ledger, in the order it applied events (its id is an
	// identity): per order, how many entries of each type and where the
	// first of each stands.
	applied := map[event]int{}    // (type, order) → ledger entries
	ledgerAt := map[event]int64{} // (type, order) → ledger id of its first entry
	inbox := map[string]event{}   // webhook-id → the entry it made
	rows, err = consumerPool.Query(ctx, "SELECT id, order_id::text, event_type, webhook_id FROM consumer_ledger ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var ledgerID int64
		var ev event
		var webhookID string
		require.NoError(t, rows.Scan(&ledgerID, &ev.orderID, &ev.typ, &webhookID))
		if applied[ev] == 0 {
			ledgerAt[ev] = ledgerID
		}
		applied[ev]++
		inbox[webhookID] = ev
	}
	require.NoError(t, rows.Err())
	var inboxRows int
	require.NoError(t, consumerPool.QueryRow(ctx, "SELECT count(*) FROM consumer_inbox").Scan(&inboxRows))
	var balance, wantBalance, placedCount, cancelledCount int64
	require.NoError(t, consumerPool.QueryRow(ctx, `SELECT coalesce(sum(balance_cents), 0),
		coalesce(sum(orders_placed), 0), coalesce(sum(orders_cancelled), 0) FROM consumer_customers`).Scan(
		&balance, &placedCount, &cancelledCount))
	for id, total := range committed {
		if !cancelled[id] { // a cancellation reverses its order's total
			wantBalance += total
		}
	}

	placed := func(id string) event { return event{"order.placed", id} }
	cancel := func(id string) event { return event{"order.cancelled", id} }
	var lost, lostCancels, phantom, twice, outOfOrder []string
	for _, a := range acks {
		if applied[placed(a.id)] == 0 {
			lost = append(lost, a.id)
		}
	}
	for _, id := range cancelAcks {
		if applied[cancel(id)] == 0 {
			lostCancels = append(lostCancels, id)
		}
	}
	for ev, n := range applied {
		if _, ok := committed[ev.orderID]; !ok || (ev.typ == "order.cancelled" && !cancelled[ev.orderID]) {
			phantom = append(phantom, ev.typ+" "+ev.orderID)
		}
		if n > 1 {
			twice = append(twice, ev.typ+" "+ev.orderID)
		}
	}
	for id := range cancelled {
		p, pok := ledgerAt[placed(id)]
		c, cok := ledgerAt[cancel(id)]
		if pok && cok && c < p {
			outOfOrder = append(outOfOrder, fmt.Sprintf("%s (order.placed at ledger id %d, order.cancelled at %d)", id, p, c))
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
	t.Logf("  cancellations acknowledged (200): %d; orders cancelled: %d (%d committed while their order.placed was not yet delivered)",
		len(cancelAcks), len(cancelled), heldBack)
	t.Logf("  worker kills: %d (%d with deliveries in flight); api kills: %d (%d with requests in flight)",
		workerKills.Load(), workerKillsInFlight.Load(), apiKills.Load(), apiKillsInFlight.Load())
	t.Logf("  connection cuts: %d rounds, %d backends terminated", cutRounds.Load(), cutBackends.Load())
	if viaJetStream {
		t.Logf("  to the consumer through JetStream stream %s: %d messages stored; consumer kills: %d", stream.name, stream.stored(), consumerKills.Load())
	} else {
		t.Logf("  receiver chaos: %v", proxy.summary())
	}
	// The longest delivery pause: a SIGKILLed worker serving the endpoint
	// holds it until the others declare it dead (the relay timeout, 5 s),
	// and a kill of River's leader (which keeps its lease ~15 s) pauses
	// nothing, as every worker dispatches.
	electionsMu.Lock()
	if !viaJetStream {
		pause := proxy.longestSilence(start, chaosEnd)
		t.Logf("  longest delivery pause at the receiver during chaos: %s", pause.Round(time.Millisecond))
	}
	t.Logf("  River leader elections seen: %d", len(elections))
	electionsMu.Unlock()
	t.Logf("  process exits we did not cause (restarted): %d %v", len(unexpected), unexpected)
	t.Logf("  %s", strings.Join(kills, "; "))
	t.Logf("  longest claim seen during chaos: %s (a claim lives as long as its request); most connections at once: %d",
		time.Duration(maxClaimedAge.Load())*time.Millisecond, maxBackends.Load())
	t.Logf("  outbox at the end: %+v", final)
	t.Logf("  consumer: applied %d, duplicates delivered %d, bad signatures %d, stale %d, out of order %d (409s seen at the proxy: %d), errors %d",
		consumerStats.Applied, consumerStats.Duplicates, consumerStats.BadSignature, consumerStats.StaleTimestamp,
		consumerStats.OutOfOrder, proxy.conflicts.Load(), consumerStats.Errors)
	if !viaJetStream {
		afterLost, afterAnswer := proxy.duplicateCauses()
		t.Logf("  duplicates by cause: %d after an answer the relay never got, %d after a 2xx the relay got but did not record (killed, or its connection cut)",
			afterLost, afterAnswer)
	}
	t.Logf("  LOST %d (and %d cancellations), PHANTOM %d, applied twice %d, OUT OF ORDER %d",
		len(lost), len(lostCancels), len(phantom), len(twice), len(outOfOrder))

	require.Empty(t, lost, "acknowledged orders never delivered")
	require.Empty(t, lostCancels, "acknowledged cancellations never delivered")
	require.Empty(t, phantom, "deliveries for orders that do not exist, or cancellations of orders not cancelled")
	require.Empty(t, twice, "events applied more than once")
	require.Empty(t, outOfOrder, "orders whose order.cancelled the consumer applied before their order.placed")
	if !viaJetStream {
		// Over webhooks the relay sends a key's next event only after the
		// previous one was answered 2xx, so the consumer never sees one
		// early. Through JetStream the consumer can: a placement it failed
		// to apply (its database connection cut) is redelivered after the
		// cancellation behind it, which it then refuses until the placement
		// is in; the ledger's order, checked above, is what must hold.
		require.Zero(t, consumerStats.OutOfOrder, "the consumer answered 409: an order.cancelled came before its order.placed")
		require.Zero(t, proxy.conflicts.Load(), "the consumer answered 409 (out of order) through the proxy")
	}
	var placedApplied, cancelsApplied int
	for ev := range applied {
		if ev.typ == "order.placed" {
			placedApplied++
		} else {
			cancelsApplied++
		}
	}
	require.Equal(t, len(committed), placedApplied, "every committed order applied, acknowledged or not")
	require.Equal(t, len(cancelled), cancelsApplied, "every cancellation applied")
	require.Positive(t, heldBack, "no cancellation was committed before its order.placed was delivered: per-key order was not exercised")
	// The cancellations: the orders cancelled are exactly those the test
	// cancelled (each acknowledged once it answered 200; a retry of one
	// whose answer was lost finds it cancelled and answers 200 again).
	acknowledged := map[string]bool{}
	for _, id := range cancelAcks {
		acknowledged[id] = true
	}
	require.Equal(t, acknowledged, cancelled, "the orders cancelled are the cancellations acknowledged")
	// Events: exactly one order.placed per committed order and one
	// order.cancelled per cancelled order, none otherwise (an event commits
	// or rolls back with its change; cancelling twice emits nothing new).
	for id, ev := range events {
		_, ok := committed[ev.orderID]
		require.True(t, ok, "event %s (%s) is about order %s, which was not committed", id, ev.typ, ev.orderID)
		require.Contains(t, []string{"order.placed", "order.cancelled"}, ev.typ, "event %s", id)
		require.False(t, ev.typ == "order.cancelled" && !cancelled[ev.orderID], "event %s cancels order %s, which is not cancelled", id, ev.orderID)
	}
	for id := range committed {
		require.Len(t, eventsOf[placed(id)], 1, "order.placed events of order %s", id)
		want := 0
		if cancelled[id] {
			want = 1
		}
		require.Len(t, eventsOf[cancel(id)], want, "order.cancelled events of order %s", id)
	}
	require.Len(t, events, len(committed)+len(cancelled), "one event per committed order and per cancellation")
	require.Empty(t, unkeyed, "events not keyed by their order's id")
	// Deliveries: one message per event and destination, and the consumer
	// holds each event exactly once (its inbox, keyed by webhook-id).
	require.Len(t, deliveries, len(events), "every committed event has a delivery to the consumer's endpoint")
	for id, n := range deliveries {
		_, ok := events[id]
		require.True(t, ok, "a message to the consumer refers to event %s, which is not an order event", id)
		require.Equal(t, 1, n, "event %s has %d messages to the consumer's endpoint", id, n)
	}
	require.Equal(t, messages, allMessages, "the consumer's endpoint is the only destination")
	require.Equal(t, len(deliveries), inboxRows, "one inbox row per event delivered to the consumer")
	for id, ev := range inbox {
		_, ok := deliveries[id]
		require.True(t, ok, "webhook-id %s is not the id of an event delivered to the consumer", id)
		require.Equal(t, events[id], ev, "webhook-id %s: the ledger entry is not what its event says", id)
	}
	require.Equal(t, wantBalance, balance, "customer balances: committed totals minus the cancelled ones, each counted exactly once")
	require.EqualValues(t, len(committed), placedCount, "orders placed, summed over customers")
	require.EqualValues(t, len(cancelled), cancelledCount, "orders cancelled, summed over customers")
	require.Equal(t, outboxStats{Delivered: int64(messages)}, outboxStats{
		Pending: final.Pending, Claimed: final.Claimed, Delivered: final.Delivered, Failed: final.Failed,
	}, "no row stuck in claimed or pending, none failed")
	require.Zero(t, consumerStats.BadSignature, "every delivery was signed with a secret the consumer holds")
	// The consumer's in-memory "applied" counter is not checked against the
	// ledger: an apply whose commit raced the relay's timeout is committed
	// but answered (and counted) as an error. The database is the truth.
	require.Positive(t, workerKills.Load())
	require.Positive(t, apiKills.Load())
	require.Positive(t, cutBackends.Load())
	if viaJetStream {
		require.Positive(t, consumerKills.Load())
	}

	// Stop everything gracefully and read the logs: no panic, no secret.
	for _, s := range services {
		s.stop(15 * time.Second)
	}
	for _, s := range services {
		logs := s.logs.String()
		require.NotContains(t, logs, "panic:", "%s panicked:\n%s", s.name, tail(s.logs.String(), 8000))
		require.NotContains(t, logs, secret, "%s logged the webhook secret", s.name)
		require.NotContains(t, logs, retiring, "%s logged a webhook secret", s.name)
		require.NotContains(t, logs, adminToken, "%s logged the admin token", s.name)
	}
}
