package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// rawDrain is the ceiling: conns connections each loop "claim 100 with SKIP
// LOCKED, then mark them delivered", two autocommit statements, no delivery,
// until the outbox is empty. With send set, each claimed batch is also POSTed,
// inFlight requests at a time per connection, before it is marked: the raw
// HTTP loop, with the relay's HTTP client and signing but no River, no
// lease, no history; or, with a broker's transport, the raw outbox loop of
// that broker.
func rawDrain(ctx context.Context, url string, n, conns int, send relay.Transport, inFlight int) (float64, error) {
	db := &database{url: url}
	pool, err := db.pool(ctx, int32(conns))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	// Open the connections, and read the endpoints, before the clock starts.
	var warm sync.WaitGroup
	for range conns {
		warm.Go(func() { _, _ = pool.Exec(ctx, "SELECT 1") })
	}
	warm.Wait()
	type endpoint struct{ url, secret string }
	endpoints := map[uuid.UUID]endpoint{}
	rows, err := pool.Query(ctx, "SELECT id, url, secret FROM webhook_endpoints")
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var id uuid.UUID
		var e endpoint
		if err := rows.Scan(&id, &e.url, &e.secret); err != nil {
			return 0, err
		}
		endpoints[id] = e
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	var done atomic.Int64
	var firstErr atomic.Pointer[error]
	fail := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for {
				rows, err := pool.Query(ctx, rawClaimSQL, 100, uuid.New())
				if err != nil {
					fail(err)
					return
				}
				var batch []relay.Delivery
				for rows.Next() {
					var d relay.Delivery
					var dest uuid.UUID
					var payload []byte
					var created time.Time
					if err := rows.Scan(&d.MessageID, &d.EventID, &dest, &d.Type, &payload, &created); err != nil {
						fail(err)
						rows.Close()
						return
					}
					d.URL, d.Secret = endpoints[dest].url, endpoints[dest].secret
					// webhook-id and the body's id are the event's, as the relay sends them.
					d.Body = admin.Message{ID: d.MessageID, EventID: d.EventID, Type: d.Type,
						CreatedAt: created, EventCreatedAt: created, Payload: payload}.Body()
					// What a broker publishes instead: the payload, its time.
					d.Data, d.CreatedAt = payload, created
					batch = append(batch, d)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					fail(err)
					return
				}
				if len(batch) == 0 {
					return
				}
				if send != nil {
					sem := make(chan struct{}, inFlight)
					var sends sync.WaitGroup
					for _, d := range batch {
						sem <- struct{}{}
						sends.Go(func() {
							defer func() { <-sem }()
							if res := send.Deliver(ctx, d); res.Err != nil || !res.Acked && res.StatusCode/100 != 2 {
								fail(fmt.Errorf("raw loop, sending: %d %v", res.StatusCode, res.Err))
							}
						})
					}
					sends.Wait()
				}
				ids := make([]uuid.UUID, len(batch))
				for i, d := range batch {
					ids[i] = d.MessageID
				}
				if _, err := pool.Exec(ctx, markDeliveredSQL, ids); err != nil {
					fail(err)
					return
				}
				done.Add(int64(len(ids)))
			}
		})
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return 0, *p
	}
	if int(done.Load()) != n {
		return 0, fmt.Errorf("raw drain delivered %d of %d", done.Load(), n)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// drainEnv is one database with endpoints, receivers and a watch pool.
type drainEnv struct {
	db    *database
	watch *pgxpool.Pool
	fast  *receiver // answers 204 at once
	slow  *receiver // answers 204 after 20 ms
}

func newDrainEnv(ctx context.Context, endpoints int) (*drainEnv, error) {
	db, err := newDatabase(ctx)
	if err != nil {
		return nil, err
	}
	e := &drainEnv{db: db}
	if e.watch, err = db.pool(ctx, 4); err != nil {
		e.close()
		return nil, err
	}
	if e.fast, err = newReceiver(0); err != nil {
		e.close()
		return nil, err
	}
	if e.slow, err = newReceiver(20 * time.Millisecond); err != nil {
		e.close()
		return nil, err
	}
	if err := addEndpoints(ctx, e.watch, endpoints, e.fast.url); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *drainEnv) close() {
	if e.fast != nil {
		e.fast.close()
	}
	if e.slow != nil {
		e.slow.close()
	}
	if e.watch != nil {
		e.watch.Close()
	}
	_ = e.db.drop()
}

// prepare empties the outbox, points every endpoint at url and preloads n.
func (e *drainEnv) prepare(ctx context.Context, n int, url string) error {
	if err := resetOutbox(ctx, e.watch); err != nil {
		return err
	}
	if _, err := e.watch.Exec(ctx, "UPDATE webhook_endpoints SET url = $1", url); err != nil {
		return err
	}
	return preloadPending(ctx, e.watch, n)
}

type drainCase struct {
	key, label string
	run        func(ctx context.Context, e *drainEnv, n int) (float64, cpuUse, error)
}

func rawCase(conns int) drainCase {
	return drainCase{fmt.Sprintf("a%d", conns), fmt.Sprintf("(a) raw SQL loop, %d connection(s)", conns),
		func(ctx context.Context, e *drainEnv, n int) (float64, cpuUse, error) {
			if err := e.prepare(ctx, n, e.fast.url); err != nil {
				return 0, cpuUse{}, err
			}
			return withCPU(ctx, e.watch, func() (float64, error) { return rawDrain(ctx, e.db.url, n, conns, nil, 0) })
		}}
}

// rawHTTPOneCase is the ceiling of HTTP delivery to one destination: the
// raw loop on four connections, each with a quarter of the requests in
// flight the relay allows a destination, so 32 in all as the relay's.
func rawHTTPOneCase() drainCase {
	inFlight := relay.DefaultConfig().DestinationConcurrency
	return drainCase{"h1", fmt.Sprintf("(h1) raw HTTP loop, one destination: claim 100, POST each, mark; 4 × %d in flight", inFlight/4),
		func(ctx context.Context, e *drainEnv, n int) (float64, cpuUse, error) {
			if err := e.prepare(ctx, n, e.fast.url); err != nil {
				return 0, cpuUse{}, err
			}
			return withCPU(ctx, e.watch, func() (float64, error) {
				return rawDrain(ctx, e.db.url, n, 4, httpTransport(), inFlight/4)
			})
		}}
}

// rawHTTPCase is the ceiling of HTTP delivery: the raw loop, posting each
// message before marking it, one connection per endpoint with as many
// requests in flight as the relay allows a destination.
func rawHTTPCase(endpoints int) drainCase {
	inFlight := relay.DefaultConfig().DestinationConcurrency
	return drainCase{"h", fmt.Sprintf("(h) raw HTTP loop: claim 100, POST each (same client and signing), mark; %d × %d in flight", endpoints, inFlight),
		func(ctx context.Context, e *drainEnv, n int) (float64, cpuUse, error) {
			if err := e.prepare(ctx, n, e.fast.url); err != nil {
				return 0, cpuUse{}, err
			}
			return withCPU(ctx, e.watch, func() (float64, error) {
				return rawDrain(ctx, e.db.url, n, endpoints, httpTransport(), inFlight)
			})
		}}
}

func relayCase(key, label string, httpTo func(*drainEnv) *receiver, s relaySetup) drainCase {
	return drainCase{key, label, func(ctx context.Context, e *drainEnv, n int) (float64, cpuUse, error) {
		url := e.fast.url
		s := s
		if httpTo != nil {
			rc := httpTo(e)
			url = rc.url
			s.Transport = httpTransport()
		} else {
			s.Transport = noopTransport{}
		}
		if err := e.prepare(ctx, n, url); err != nil {
			return 0, cpuUse{}, err
		}
		return withCPU(ctx, e.watch, func() (float64, error) { return relayDrain(ctx, e.db.url, e.watch, n, s) })
	}}
}

// windowRate runs a relay on a preloaded outbox and returns messages
// delivered per second over window, after warmup: for slow receivers, where
// draining everything would take minutes.
func windowRate(ctx context.Context, e *drainEnv, n int, s relaySetup, warmup, window time.Duration, smoke bool) (float64, error) {
	if err := e.prepare(ctx, n, e.slow.url); err != nil {
		return 0, err
	}
	s.Transport = httpTransport()
	base := e.slow.requests.Load() // the receiver's count goes on across runs
	r, err := startRelay(ctx, e.db.url, s)
	if err != nil {
		return 0, err
	}
	defer r.stop()
	time.Sleep(warmup)
	// Count webhooks at the receiver: outcomes are recorded in batches, so
	// rows lag the requests a little.
	d0 := e.slow.requests.Load()
	t0 := time.Now()
	time.Sleep(window)
	d1 := e.slow.requests.Load()
	if d1-base >= int64(n) && !smoke { // a smoke run proves the code path, not the figure
		return 0, fmt.Errorf("backlog of %d ran out during the window: preload more", n)
	}
	return float64(d1-d0) / time.Since(t0).Seconds(), nil
}

func scenarioDrain(ctx context.Context, cfg config, rep *report) error {
	e, err := newDrainEnv(ctx, cfg.Endpoints)
	if err != nil {
		return err
	}
	defer e.close()
	def := relay.DefaultConfig()
	cases := []drainCase{
		rawCase(1), rawCase(2), rawCase(4),
		relayCase("b", "(b) relay, no-op transport", nil, relaySetup{Config: def}),
		rawHTTPCase(cfg.Endpoints),
		relayCase("c", "(c) relay, HTTP to a local receiver answering 204 at once", func(e *drainEnv) *receiver { return e.fast }, relaySetup{Config: def}),
	}
	if only := os.Getenv("BENCH_DRAIN_CASES"); only != "" { // for profiling one case
		cases = slices.DeleteFunc(cases, func(c drainCase) bool { return !strings.Contains(","+only+",", ","+c.key+",") })
	}
	// One destination: where one endpoint's backlog drains after an
	// outage, the usual case of a service with one to three endpoints.
	one, err := newDrainEnv(ctx, 1)
	if err != nil {
		return err
	}
	defer one.close()
	single := []drainCase{rawHTTPOneCase(), relayCase("c1", "(c1) relay, one destination, HTTP to a local receiver answering 204 at once",
		func(e *drainEnv) *receiver { return e.fast }, relaySetup{Config: def})}
	if only := os.Getenv("BENCH_DRAIN_CASES"); only != "" {
		single = slices.DeleteFunc(single, func(c drainCase) bool { return !strings.Contains(","+only+",", ","+c.key+",") })
	}
	samples := map[string][]float64{}
	pgPer, selfPer, idle := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	measure := func(c drainCase, e *drainEnv) error {
		r, cpu, err := c.run(ctx, e, cfg.Drain)
		if err != nil {
			return fmt.Errorf("drain %s: %w", c.label, err)
		}
		samples[c.key] = append(samples[c.key], r)
		pgPer[c.key] = append(pgPer[c.key], cpu.pgPerMsg(cfg.Drain))
		selfPer[c.key] = append(selfPer[c.key], cpu.selfPerMsg(cfg.Drain))
		idle[c.key] = append(idle[c.key], cpu.idle())
		logf("  %s: %s msgs/s (CPU per message: PostgreSQL %.0f µs, bench %.0f µs; cores idle %.0f %%)", c.label, rate(r),
			cpu.pgPerMsg(cfg.Drain), cpu.selfPerMsg(cfg.Drain), 100*cpu.idle())
		return nil
	}
	for range cfg.Reps {
		for _, c := range cases {
			if err := measure(c, e); err != nil {
				return err
			}
		}
		for _, c := range single {
			if err := measure(c, one); err != nil {
				return err
			}
		}
	}
	med := map[string]float64{}
	for k, xs := range samples {
		med[k] = median(xs)
	}
	// The ceiling is the best raw SQL loop; best names it.
	best := "a1"
	for _, k := range []string{"a2", "a4"} {
		if med[k] > med[best] {
			best = k
		}
	}
	ceiling := med[best]

	// (d): 20 ms receiver, at rising concurrency, measured over a window.
	concs := []int{1, 4, def.DestinationConcurrency, 64}
	if only := os.Getenv("BENCH_DRAIN_CASES"); only != "" && !strings.Contains(only, "d") {
		concs = nil
	}
	dRates := make([]float64, len(concs))
	for i, c := range concs {
		s := relaySetup{Config: def}
		s.Config.DestinationConcurrency = c
		r, err := windowRate(ctx, e, cfg.SlowDrain, s, cfg.SlowWarmup, cfg.SlowWindow, cfg.Smoke)
		if err != nil {
			return fmt.Errorf("drain (d) at concurrency %d: %w", c, err)
		}
		dRates[i] = r
		logf("  (d) %d per destination: %s msgs/s", c, rate(r))
	}

	var b strings.Builder
	fmt.Fprintf(&b, "A backlog of **%s pending messages over %d endpoints** (each the one delivery of its own event; one `INSERT … SELECT generate_series`, ~300-byte order payloads), drained until nothing is pending or claimed. "+
		"Medians of %d runs, cases interleaved run by run. Relay cases use `relay.New` + `Relay.Start` (real River, dispatch and heartbeat) with `relay.DefaultConfig()` and a 20-connection pool, as `cmd/worker`; the clock starts before the relay starts, so River's start and the first dispatch are included. "+
		"The receiver is a `net/http` server on 127.0.0.1 in the same process (it does not verify signatures); the relay and the raw HTTP loop use `relay.HTTPTransport` with `netguard.Guard{AllowPrivate: true}.Client()`. "+
		"The raw loops claim with one statement over the whole outbox, the relay one destination at a time under its lease.\n\n",
		commas(int64(cfg.Drain)), cfg.Endpoints, cfg.Reps)
	row := func(c drainCase) {
		fmt.Fprintf(&b, "| %s | %s | %.2f | %.0f µs | %.0f µs | %.0f %% |\n", c.label, rate(med[c.key]), med[c.key]/ceiling,
			median(pgPer[c.key]), median(selfPer[c.key]), 100*median(idle[c.key]))
	}
	const header = "| case | msgs/s | vs best (a) | PostgreSQL CPU per message | bench-process CPU per message | cores idle |\n|---|---:|---:|---:|---:|---:|\n"
	b.WriteString(header)
	for _, c := range cases {
		row(c)
	}
	if med["h"] > 0 {
		fmt.Fprintf(&b, "\nThe relay's HTTP drain (c) is **%.2f ×** the raw HTTP loop (h) in this run: what the relay's guarantees cost (River jobs, the lease, per-destination claims, the attempt history, outcomes recorded as they come).\n", med["c"]/med["h"])
	}
	b.WriteString("\nCPU per message (this database's PostgreSQL backends, and this process: relay, River, receiver) is the figure that noise on a shared machine disturbs least: msgs/s ≈ 2 cores / (sum of the two), when the cores are ours alone. " +
		"Cores idle: the share of the machine's cores that neither used while the case ran; a case below its raw loop with cores idle waits on its own pipeline, not on the machine.\n")
	if len(single) > 0 {
		fmt.Fprintf(&b, "\n**One destination.** The same backlog for a single endpoint, as an outage leaves it, interleaved with the cases above: the raw loop with the relay's ceiling per destination in flight in all (4 × %d), and the relay at its defaults.\n\n",
			def.DestinationConcurrency/4)
		b.WriteString(header)
		for _, c := range single {
			row(c)
		}
		if med["h1"] > 0 {
			fmt.Fprintf(&b, "\nThe relay's one-destination drain (c1) is **%.2f ×** the raw loop (h1) in this run.\n", med["c1"]/med["h1"])
		}
	}
	fmt.Fprintf(&b, "\n**(d) the receiver answers after 20 ms.** Webhooks received per second (counted at the receiver) over a %s window after %s of warm-up (backlog %s over %d endpoints), at each `DestinationConcurrency` (`OUTBOX_DESTINATION_CONCURRENCY`): at most that many requests in flight per destination, so the ideal is endpoints × concurrency / 20 ms.\n\n",
		cfg.SlowWindow, cfg.SlowWarmup, commas(int64(cfg.SlowDrain)), cfg.Endpoints)
	b.WriteString("| DestinationConcurrency | max in flight | ideal msgs/s | measured msgs/s | vs best (a) |\n|---:|---:|---:|---:|---:|\n")
	for i, c := range concs {
		inFlight := c * cfg.Endpoints
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %.2f |\n", c, inFlight, rate(float64(inFlight)/0.020), rate(dRates[i]), dRates[i]/ceiling)
	}
	rep.section("2. Drain", b.String())

	rep.results["drain.ceiling"] = ceiling
	rep.results["drain.b"] = med["b"]
	rep.results["drain.c"] = med["c"]
	// The bars are the relay's figures before per-destination scheduling,
	// as ratios to the raw loop measured in the same run then (16,057 and
	// 9,872 msgs/s against 37,591).
	rep.target("Drain (b) relay, no-op transport", "≥ 0.43 × (a)",
		fmt.Sprintf("%s msgs/s = %.2f × (a) %s", rate(med["b"]), med["b"]/ceiling, rate(ceiling)), med["b"] >= 0.43*ceiling)
	rep.target("Drain (c) relay, real HTTP, 204 at once", "≥ 0.26 × (a), and reported against (h)",
		fmt.Sprintf("%s msgs/s = %.2f × (a); %.2f × (h) %s", rate(med["c"]), med["c"]/ceiling, med["c"]/med["h"], rate(med["h"])), med["c"] >= 0.26*ceiling)
	// The bars of the next step (issue "one destination at full speed"):
	// the relay against its raw loops, side by side.
	if med["h1"] > 0 && med["c1"] > 0 {
		rep.target("Drain (c1) one destination: relay vs raw HTTP loop (h1), same in flight", "≥ 0.7",
			fmt.Sprintf("%.2f (%s vs %s msgs/s)", med["c1"]/med["h1"], rate(med["c1"]), rate(med["h1"])), med["c1"] >= 0.7*med["h1"])
	}
	if med["h"] > 0 && med["c"] > 0 {
		rep.target(fmt.Sprintf("Drain (c) %d destinations: relay vs raw HTTP loop (h)", cfg.Endpoints), "≥ 0.8",
			fmt.Sprintf("%.2f", med["c"]/med["h"]), med["c"] >= 0.8*med["h"])
	}
	if med["b"] > 0 && ceiling > 0 {
		rep.target("Drain (b) no-op transport vs raw SQL loop (a)", "≥ 0.6",
			fmt.Sprintf("%.2f", med["b"]/ceiling), med["b"] >= 0.6*ceiling)
		if pgB, pgA := median(pgPer["b"]), median(pgPer[best]); pgA > 0 {
			rep.target("PostgreSQL CPU per message: relay (b) vs raw SQL loop (best a)", "≤ 1.5×",
				fmt.Sprintf("%.2f× (%.0f vs %.0f µs)", pgB/pgA, pgB, pgA), pgB <= 1.5*pgA)
		}
	}
	rising := true
	for i := 1; i < len(dRates); i++ {
		if dRates[i] < dRates[i-1] {
			rising = false
		}
	}
	var ds []string
	for i, c := range concs {
		ds = append(ds, fmt.Sprintf("%d in flight: %s", c*cfg.Endpoints, rate(dRates[i])))
	}
	rep.target("Drain (d) 20 ms receiver: limited by concurrency", "msgs/s rises with concurrency", strings.Join(ds, "; "), rising)
	return nil
}

type cpuUse struct{ pg, self, wall time.Duration }

// idle is the share of the machine's cores that neither PostgreSQL nor
// this process used.
func (c cpuUse) idle() float64 {
	if c.wall <= 0 {
		return 0
	}
	return max(0, 1-float64(c.pg+c.self)/(float64(c.wall)*float64(runtime.NumCPU())))
}

func (c cpuUse) pgPerMsg(n int) float64   { return float64(c.pg.Microseconds()) / float64(n) }
func (c cpuUse) selfPerMsg(n int) float64 { return float64(c.self.Microseconds()) / float64(n) }

// withCPU runs f and returns the CPU time this database's PostgreSQL
// backends and this process used meanwhile.
func withCPU(ctx context.Context, watch *pgxpool.Pool, f func() (float64, error)) (float64, cpuUse, error) {
	w := watchDBCPU(ctx, watch)
	self0, t0 := selfCPU(), time.Now()
	r, err := f()
	return r, cpuUse{w.total(), selfCPU() - self0, time.Since(t0)}, err
}
