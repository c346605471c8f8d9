package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

type latencyResult struct {
	placed, dropped, lost int
	achieved              float64
	p50, p95, p99, max    time.Duration
}

// openLoop places orders at rate per second for d, on schedule whatever the
// latency of earlier ones (an open loop: a slow system does not slow the
// load down), and measures commit-to-delivery for each: from Place
// returning (the commit) to the receiver's handler starting.
func openLoop(ctx context.Context, svc *orders.Service, rc *receiver, ratePerSec int, d time.Duration) (latencyResult, error) {
	rc.reset(false, true)
	var mu sync.Mutex
	commits := map[string]time.Time{}
	var failed atomic.Pointer[error]
	jobs := make(chan int64, 4096)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := range jobs {
				o, _, err := svc.Place(ctx, placeRequest(i))
				at := time.Now()
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					continue
				}
				mu.Lock()
				commits[o.ID.String()] = at
				mu.Unlock()
			}
		})
	}
	total := int(float64(ratePerSec) * d.Seconds())
	interval := time.Second / time.Duration(ratePerSec)
	var res latencyResult
	start := time.Now()
	for i := range total {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		select {
		case jobs <- int64(i):
		default:
			res.dropped++ // the placers are this far behind: not open loop any more
		}
	}
	close(jobs)
	wg.Wait()
	res.achieved = float64(total-res.dropped) / time.Since(start).Seconds()
	if p := failed.Load(); p != nil {
		return res, *p
	}
	// Wait for the tail to be delivered.
	deadline := time.Now().Add(30 * time.Second)
	for {
		rc.mu.Lock()
		n := len(rc.arrivals)
		rc.mu.Unlock()
		if n >= len(commits) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rc.mu.Lock()
	var lat []time.Duration
	for id, c := range commits {
		if a, ok := rc.arrivals[id]; ok {
			lat = append(lat, max(0, a.Sub(c)))
		} else {
			res.lost++
		}
	}
	rc.mu.Unlock()
	res.placed = len(commits)
	slices.Sort(lat)
	res.p50, res.p95, res.p99 = percentile(lat, .50), percentile(lat, .95), percentile(lat, .99)
	if len(lat) > 0 {
		res.max = lat[len(lat)-1]
	}
	if res.lost > 0 {
		return res, fmt.Errorf("%d of %d orders' webhooks never arrived", res.lost, res.placed)
	}
	return res, nil
}

// latencySetting is one way to run the relay and write the orders: the
// poll interval, and whether commits wake the relay (OUTBOX_NOTIFY=true:
// orders written through a pool made with outbox.NotifyRelays, the relay
// started with Listen).
type latencySetting struct {
	name   string
	poll   time.Duration
	notify bool
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// idleCost is what a relay costs while nothing is due.
type idleCost struct {
	pgCPU, selfCPU       float64 // CPU ms per second
	deliverJobs, allJobs float64 // River jobs per second
}

// latencyRun starts a relay for s, warms it up, measures its idle cost
// (when idle > 0) and then the latency at each rate, and stops it.
func latencyRun(ctx context.Context, dbURL string, pool *pgxpool.Pool, svc *orders.Service, rc *receiver,
	s latencySetting, rates []int, d, idle time.Duration) (map[int]latencyResult, idleCost, error) {
	c := relay.DefaultConfig()
	c.PollInterval, c.Listen = s.poll, s.notify
	r, err := startRelay(ctx, dbURL, relaySetup{Config: c, Transport: httpTransport()})
	if err != nil {
		return nil, idleCost{}, err
	}
	defer r.stop()
	// Warm up: River's services start staggered; the first webhook opens
	// the connection, and the listener connects.
	if _, err := openLoop(ctx, svc, rc, 50, time.Second); err != nil {
		return nil, idleCost{}, fmt.Errorf("%s: warm-up: %w", s.name, err)
	}
	var cost idleCost
	if idle > 0 {
		// Idle cost of this setting: CPU of PostgreSQL and of this process
		// (the relay; nothing else runs) while nothing is due.
		var jobs0, delivers0 int64
		_ = pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE kind = 'outbox_deliver'), count(*) FROM river_job").Scan(&delivers0, &jobs0)
		w := watchDBCPU(ctx, pool)
		self0, t0 := selfCPU(), time.Now()
		time.Sleep(idle)
		pgUsed, self1, el := w.total(), selfCPU(), time.Since(t0)
		var jobs1, delivers1 int64
		_ = pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE kind = 'outbox_deliver'), count(*) FROM river_job").Scan(&delivers1, &jobs1)
		cost = idleCost{float64(pgUsed) / float64(time.Millisecond) / el.Seconds(),
			float64(self1-self0) / float64(time.Millisecond) / el.Seconds(),
			float64(delivers1-delivers0) / el.Seconds(), float64(jobs1-jobs0) / el.Seconds()}
	}
	out := map[int]latencyResult{}
	for _, rt := range rates {
		res, err := openLoop(ctx, svc, rc, rt, d)
		if err != nil {
			return nil, idleCost{}, fmt.Errorf("%s at %d/s: %w", s.name, rt, err)
		}
		logf("  %s @ %d/s: p50 %s p95 %s p99 %s (achieved %.0f/s, dropped %d)", s.name, rt, ms(res.p50), ms(res.p95), ms(res.p99), res.achieved, res.dropped)
		out[rt] = res
	}
	return out, cost, nil
}

// medianLatency folds repeated runs: the median of each percentile and of
// the achieved rate, the largest max, and the sums of what was placed,
// dropped and lost.
func medianLatency(runs []latencyResult) latencyResult {
	var m latencyResult
	var p50, p95, p99, achieved []float64
	for _, r := range runs {
		p50, p95, p99 = append(p50, float64(r.p50)), append(p95, float64(r.p95)), append(p99, float64(r.p99))
		achieved = append(achieved, r.achieved)
		m.max = max(m.max, r.max)
		m.placed, m.dropped, m.lost = m.placed+r.placed, m.dropped+r.dropped, m.lost+r.lost
	}
	m.p50, m.p95, m.p99 = time.Duration(median(p50)), time.Duration(median(p95)), time.Duration(median(p99))
	m.achieved = median(achieved)
	return m
}

func scenarioLatency(ctx context.Context, cfg config, rep *report) error {
	db, err := newDatabase(ctx)
	if err != nil {
		return err
	}
	defer db.drop() //nolint:errcheck
	pool, err := db.pool(ctx, 24)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The OUTBOX_NOTIFY=true api's pool: its order transactions NOTIFY.
	notifyPool, err := db.notifyPool(ctx, 24)
	if err != nil {
		return err
	}
	defer notifyPool.Close()
	rc, err := newReceiver(0)
	if err != nil {
		return err
	}
	defer rc.close()
	if err := addEndpoints(ctx, pool, 1, rc.url); err != nil {
		return err
	}
	svcs := map[bool]*orders.Service{false: orders.NewService(pool, discard), true: orders.NewService(notifyPool, discard)}
	def := relay.DefaultConfig()
	poll := latencySetting{name: fmt.Sprintf("default (PollInterval %s)", def.PollInterval), poll: def.PollInterval}
	notify := latencySetting{name: fmt.Sprintf("OUTBOX_NOTIFY (PollInterval %s, NOTIFY at commit, relay LISTENs)", def.PollInterval),
		poll: def.PollInterval, notify: true}
	others := []latencySetting{}
	if def.PollInterval != 200*time.Millisecond {
		others = append(others, latencySetting{name: "PollInterval 200ms", poll: 200 * time.Millisecond})
	}
	others = append(others, latencySetting{name: "lowest latency without NOTIFY (PollInterval 20ms)", poll: 20 * time.Millisecond})

	type row struct {
		setting string
		rate    int
		runs    int
		res     latencyResult
	}
	var rows []row
	type idleRow struct {
		setting string
		cost    idleCost
	}
	var idle []idleRow

	// Poll and NOTIFY side by side: a relay of each kind in turn, run by
	// run, so drift on a noisy machine hits both alike; the idle cost is
	// measured in the first run of each.
	paired := []latencySetting{poll, notify}
	runs := map[string]map[int][]latencyResult{}
	for i := range cfg.Reps {
		for _, s := range paired {
			window := time.Duration(0)
			if i == 0 {
				window = cfg.IdleWindow
			}
			res, cost, err := latencyRun(ctx, db.url, pool, svcs[s.notify], rc, s, cfg.LatencyRates, cfg.LatencyDuration, window)
			if err != nil {
				return err
			}
			if i == 0 {
				idle = append(idle, idleRow{s.name, cost})
			}
			if runs[s.name] == nil {
				runs[s.name] = map[int][]latencyResult{}
			}
			for rt, r := range res {
				runs[s.name][rt] = append(runs[s.name][rt], r)
			}
		}
	}
	for _, s := range paired {
		for _, rt := range cfg.LatencyRates {
			rows = append(rows, row{s.name, rt, len(runs[s.name][rt]), medianLatency(runs[s.name][rt])})
		}
	}
	// The other poll intervals, once each.
	for _, s := range others {
		res, cost, err := latencyRun(ctx, db.url, pool, svcs[s.notify], rc, s, cfg.LatencyRates, cfg.LatencyDuration, cfg.IdleWindow)
		if err != nil {
			return err
		}
		idle = append(idle, idleRow{s.name, cost})
		for _, rt := range cfg.LatencyRates {
			rows = append(rows, row{s.name, rt, 1, res[rt]})
		}
	}
	find := func(setting string, rt int) latencyResult {
		for _, r := range rows {
			if r.setting == setting && r.rate == rt {
				return r.res
			}
		}
		return latencyResult{}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "Commit-to-delivery latency: from `orders.Service.Place` returning (the commit) to the receiver's handler starting, for every order placed by an open-loop generator (orders scheduled at a fixed rate for %s, whatever the latency of earlier ones; 64 placing goroutines). "+
		"One endpoint subscribed; real HTTP to a loopback receiver answering 204; the real relay (`relay.Start`) with `relay.DefaultConfig()` except what the setting names, started afresh for each run and warmed up (1 s at 50 orders/s) before it. "+
		"Without `OUTBOX_NOTIFY` nothing in the order transaction wakes the relay: it finds an order at its next poll. "+
		"With it, the orders are placed through a pool made with `outbox.NotifyRelays` (as the api's with `OUTBOX_NOTIFY=true`), so `EventEnqueue` queues a NOTIFY sent at commit, and the relay runs with `Listen: true` (as the worker's), waking the destination's deliver job at once; the poll goes on beside it. "+
		"The first two settings are medians of %d runs each, interleaved run by run (max: the largest of the runs); the others are one run each. "+
		"An achieved rate below the scheduled one means the placing goroutines could not keep to the schedule: orders waited in the generator's queue before their transaction began, which the latency (from the commit) does not count.\n\n", cfg.LatencyDuration, cfg.Reps)
	b.WriteString("| setting | orders/s (achieved) | runs | p50 | p95 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d (%.0f) | %d | %s | %s | %s | %s |\n", r.setting, r.rate, r.res.achieved, r.runs, ms(r.res.p50), ms(r.res.p95), ms(r.res.p99), ms(r.res.max))
	}
	b.WriteString("\n**Poll or NOTIFY, side by side** (the first two settings above): what `OUTBOX_NOTIFY=true` buys in latency; section 1 shows what it costs the write path.\n\n")
	b.WriteString("| orders/s | poll p50 | NOTIFY p50 | poll p99 | NOTIFY p99 |\n|---:|---:|---:|---:|---:|\n")
	for _, rt := range cfg.LatencyRates {
		p, n := find(poll.name, rt), find(notify.name, rt)
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", rt, ms(p.p50), ms(n.p50), ms(p.p99), ms(n.p99))
	}
	fmt.Fprintf(&b, "\n**The cost of polling**, measured with the relay idle (nothing due) for %s: CPU time per wall-clock second used by this database's PostgreSQL backends and by the relay's process (which runs nothing else meanwhile: its dispatch poll, its heartbeat and, with NOTIFY, its idle listener), and River jobs inserted per second.\n\n", cfg.IdleWindow)
	b.WriteString("| setting | PostgreSQL CPU (ms/s) | relay CPU (ms/s) | deliver jobs/s | all River jobs/s |\n|---|---:|---:|---:|---:|\n")
	for _, r := range idle {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %.1f |\n", r.setting, r.cost.pgCPU, r.cost.selfCPU, r.cost.deliverJobs, r.cost.allJobs)
	}
	rep.section("3. Latency", b.String())

	if r := find(poll.name, 200); r.placed > 0 {
		ok := r.p50 < 50*time.Millisecond && r.p99 < 250*time.Millisecond
		rep.target("Latency at 200 orders/s, default settings, no NOTIFY", "p50 < 50 ms, p99 < 250 ms",
			fmt.Sprintf("p50 %s, p99 %s", ms(r.p50), ms(r.p99)), ok)
	}
	for _, rt := range cfg.LatencyRates {
		p, n := find(poll.name, rt), find(notify.name, rt)
		logf("  poll vs NOTIFY @ %d/s: p50 %s vs %s, p99 %s vs %s", rt, ms(p.p50), ms(n.p50), ms(p.p99), ms(n.p99))
	}
	return nil
}
