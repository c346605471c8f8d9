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

	"github.com/google/uuid"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox"
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

type latencySetting struct {
	name string
	poll time.Duration
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
	rc, err := newReceiver(0)
	if err != nil {
		return err
	}
	defer rc.close()
	if err := addEndpoints(ctx, pool, 1, rc.url); err != nil {
		return err
	}
	svc := orders.NewService(pool, discard)
	def := outbox.DefaultRelayConfig()
	settings := []latencySetting{
		{fmt.Sprintf("default (PollInterval %s)", def.PollInterval), def.PollInterval},
	}
	if def.PollInterval != 200*time.Millisecond {
		settings = append(settings, latencySetting{"PollInterval 200ms", 200 * time.Millisecond})
	}
	settings = append(settings, latencySetting{"lowest latency (PollInterval 20ms)", 20 * time.Millisecond})
	type row struct {
		setting string
		rate    int
		res     latencyResult
	}
	var rows []row
	type idleRow struct {
		setting              string
		pgCPU, selfCPU       float64 // CPU ms per second
		deliverJobs, allJobs float64 // River jobs per second
	}
	var idle []idleRow
	for _, s := range settings {
		c := def
		c.PollInterval = s.poll
		r, err := startRelay(ctx, db.url, relaySetup{Config: c, Transport: httpTransport()})
		if err != nil {
			return err
		}
		// Warm up: River's services start staggered; the first webhook
		// opens the connection.
		if _, err := openLoop(ctx, svc, rc, 50, time.Second); err != nil {
			r.stop()
			return fmt.Errorf("warm-up: %w", err)
		}
		// Idle cost of this poll interval: CPU of PostgreSQL and of this
		// process (the relay; nothing else runs) while nothing is due.
		var jobs0, delivers0 int64
		_ = pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE kind = 'outbox_deliver'), count(*) FROM river_job").Scan(&delivers0, &jobs0)
		w := watchDBCPU(ctx, pool)
		self0, t0 := selfCPU(), time.Now()
		time.Sleep(cfg.IdleWindow)
		pgUsed, self1, el := w.total(), selfCPU(), time.Since(t0)
		var jobs1, delivers1 int64
		_ = pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE kind = 'outbox_deliver'), count(*) FROM river_job").Scan(&delivers1, &jobs1)
		idle = append(idle, idleRow{s.name, float64(pgUsed) / float64(time.Millisecond) / el.Seconds(),
			float64(self1-self0) / float64(time.Millisecond) / el.Seconds(),
			float64(delivers1-delivers0) / el.Seconds(), float64(jobs1-jobs0) / el.Seconds()})

		for _, rt := range cfg.LatencyRates {
			res, err := openLoop(ctx, svc, rc, rt, cfg.LatencyDuration)
			if err != nil {
				r.stop()
				return fmt.Errorf("%s at %d/s: %w", s.name, rt, err)
			}
			logf("  %s @ %d/s: p50 %s p95 %s p99 %s (achieved %.0f/s, dropped %d)", s.name, rt, ms(res.p50), ms(res.p95), ms(res.p99), res.achieved, res.dropped)
			rows = append(rows, row{s.name, rt, res})
		}
		r.stop()
	}

	var b strings.Builder
	fmt.Fprintf(&b, "Commit-to-delivery latency: from `orders.Service.Place` returning (the commit) to the receiver's handler starting, for every order placed by an open-loop generator (orders scheduled at a fixed rate for %s, whatever the latency of earlier ones; 64 placing goroutines). "+
		"One endpoint subscribed; real HTTP to a loopback receiver answering 204; the real relay (`relay.Start`) with `DefaultRelayConfig()` except the poll interval. No NOTIFY anywhere in the order transaction.\n\n", cfg.LatencyDuration)
	b.WriteString("| setting | orders/s (achieved) | p50 | p95 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d (%.0f) | %s | %s | %s | %s |\n", r.setting, r.rate, r.res.achieved, ms(r.res.p50), ms(r.res.p95), ms(r.res.p99), ms(r.res.max))
	}
	fmt.Fprintf(&b, "\n**The cost of polling**, measured with the relay idle (nothing due) for %s: CPU time per wall-clock second used by this database's PostgreSQL backends and by the relay's process (which runs nothing else meanwhile: its dispatch poll and its heartbeat), and River jobs inserted per second.\n\n", cfg.IdleWindow)
	b.WriteString("| setting | PostgreSQL CPU (ms/s) | relay CPU (ms/s) | deliver jobs/s | all River jobs/s |\n|---|---:|---:|---:|---:|\n")
	for _, r := range idle {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %.1f |\n", r.setting, r.pgCPU, r.selfCPU, r.deliverJobs, r.allJobs)
	}
	rep.section("3. Latency", b.String())

	for _, r := range rows {
		if r.setting == settings[0].name && r.rate == 200 {
			ok := r.res.p50 < 50*time.Millisecond && r.res.p99 < 250*time.Millisecond
			rep.target("Latency at 200 orders/s, default settings, no NOTIFY", "p50 < 50 ms, p99 < 250 ms",
				fmt.Sprintf("p50 %s, p99 %s", ms(r.res.p50), ms(r.res.p99)), ok)
		}
	}
	_ = uuid.Nil
	return nil
}
