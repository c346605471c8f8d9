package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// Many endpoints: a service that sends to one endpoint per customer. Two
// measurements at the defaults, each on a fresh database with a relay in
// this process:
//
//   - fan-out: one order to every endpoint (all subscribed to
//     order.placed): how long its transaction took, how long until every
//     endpoint had its webhook, and how many deliver jobs that took (one
//     per destination is the floor; more means destinations were
//     dispatched again while their job waited);
//   - idle cost: a few healthy endpoints beside many that are down and
//     backing off with a backlog each: the CPU of PostgreSQL and of the
//     relay per second while nothing is due, and commit-to-delivery at the
//     healthy ones, against the same healthy endpoints alone.

// downEndpoints registers n endpoints at a port that refuses connections,
// subscribed to no event the bench places, each with backlog pending
// messages, and backing off as a relay leaves a failing destination: its
// next probe at a random time within the hour.
func downEndpoints(ctx context.Context, pool *pgxpool.Pool, n, backlog int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	refused := "http://" + ln.Addr().String() + "/down"
	_ = ln.Close() // nothing listens there any more: connections are refused
	_, err = pool.Exec(ctx, `
		WITH e AS (
			INSERT INTO webhook_endpoints (url, secret, event_types, health, health_reason, health_changed_at,
			                               consecutive_failures, backoff_until)
			SELECT $1, 'whsec_'||encode(sha256(g::text::bytea), 'base64'), ARRAY['order.cancelled'],
			       'backing_off', 'connection refused', now(), 12, now() + random() * interval '1 hour'
			FROM generate_series(1, $2::int) g
			RETURNING id
		), src AS MATERIALIZED (
			SELECT e.id AS dest, clock_timestamp() AS at FROM e, generate_series(1, $3::int)
		), ids AS MATERIALIZED (
			SELECT dest, at, outbox_uuid_v7_at(at) AS id FROM src
		), ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT id, 'order.cancelled', '{"id":"x"}', at FROM ids
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(id), id, 'order.cancelled', dest, at, at FROM ids`, refused, n, backlog)
	if err != nil {
		return fmt.Errorf("adding %d endpoints that are down: %w", n, err)
	}
	_, err = pool.Exec(ctx, "VACUUM ANALYZE webhook_endpoints, outbox_events, outbox_messages")
	return err
}

// deliverJobs counts the deliver jobs River holds (completed ones are kept
// for a day), and the most any one destination had.
func deliverJobs(ctx context.Context, pool *pgxpool.Pool) (total, most int64, err error) {
	err = pool.QueryRow(ctx, `
		SELECT coalesce(sum(n), 0)::bigint, coalesce(max(n), 0)::bigint FROM (
			SELECT count(*) AS n FROM river_job WHERE kind = 'outbox_deliver' GROUP BY args->>'destination') j`).
		Scan(&total, &most)
	return total, most, err
}

// endpointsEnv is a fresh database, a pool of conns to it and a receiver;
// done drops and closes them.
func endpointsEnv(ctx context.Context, conns int32) (*database, *pgxpool.Pool, *receiver, func(), error) {
	db, err := newDatabase(ctx)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	pool, err := db.pool(ctx, conns)
	if err != nil {
		_ = db.drop()
		return nil, nil, nil, nil, err
	}
	rc, err := newReceiver(0)
	if err != nil {
		pool.Close()
		_ = db.drop()
		return nil, nil, nil, nil, err
	}
	return db, pool, rc, func() { rc.close(); pool.Close(); _ = db.drop() }, nil
}

type fanOut struct {
	write, all, half time.Duration
	jobs, most       int64
	requests         int64
	// pgCPU and selfCPU are the CPU PostgreSQL and this process (the
	// relay, the receiver) used from the order's commit until every
	// endpoint had its webhook.
	pgCPU, selfCPU time.Duration
}

// fanOutOnce places one order to n endpoints and waits until each has its
// webhook.
func fanOutOnce(ctx context.Context, n int) (fanOut, error) {
	var res fanOut
	db, pool, rc, done, err := endpointsEnv(ctx, 8)
	if err != nil {
		return res, err
	}
	defer done()
	if err := addEndpoints(ctx, pool, n, rc.url); err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE webhook_endpoints"); err != nil {
		return res, err
	}
	r, err := startRelay(ctx, db.url, relaySetup{Config: relay.DefaultConfig(), Transport: httpTransport()})
	if err != nil {
		return res, err
	}
	defer r.stop()
	time.Sleep(time.Second) // River's services start staggered
	svc := orders.NewService(pool, discard)
	start := time.Now()
	if _, _, err := svc.Place(ctx, placeRequest(1)); err != nil {
		return res, err
	}
	committed := time.Now()
	w, self0 := watchDBCPU(ctx, pool), selfCPU()
	res.write = committed.Sub(start)
	if err := until(ctx, 5*time.Minute, "every endpoint's webhook", func() (bool, error) {
		got := rc.requests.Load()
		if res.half == 0 && got >= int64(n)/2 {
			res.half = time.Since(committed)
		}
		return got >= int64(n), nil
	}); err != nil {
		return res, err
	}
	res.all = time.Since(committed)
	res.pgCPU, res.selfCPU = w.total(), selfCPU()-self0
	// Let the last jobs settle, then count them.
	if _, err := waitDrained(ctx, pool, time.Minute); err != nil {
		return res, err
	}
	time.Sleep(500 * time.Millisecond)
	res.requests = rc.requests.Load()
	res.jobs, res.most, err = deliverJobs(ctx, pool)
	return res, err
}

type idleAt struct {
	cost idleCost
	lat  latencyResult
}

// idleBeside measures, with healthy endpoints at the receiver and down
// endpoints that are down with a backlog each, the idle cost and then the
// commit-to-delivery of orders placed at ratePerSec.
func idleBeside(ctx context.Context, healthy, down, backlog, ratePerSec int, window, d time.Duration) (idleAt, error) {
	var res idleAt
	db, pool, rc, done, err := endpointsEnv(ctx, 24)
	if err != nil {
		return res, err
	}
	defer done()
	rc.latest = true
	if err := addEndpoints(ctx, pool, healthy, rc.url); err != nil {
		return res, err
	}
	if down > 0 {
		if err := downEndpoints(ctx, pool, down, backlog); err != nil {
			return res, err
		}
	}
	svc := orders.NewService(pool, discard)
	lat, cost, err := latencyRun(ctx, db.url, pool, svc, rc, latencySetting{name: fmt.Sprintf("%d healthy beside %d down", healthy, down),
		poll: relay.DefaultConfig().PollInterval}, []int{ratePerSec}, d, window)
	if err != nil {
		return res, err
	}
	return idleAt{cost: cost, lat: lat[ratePerSec]}, nil
}

func scenarioEndpoints(ctx context.Context, cfg config, rep *report) error {
	n, healthy := cfg.ManyEndpoints, 10
	var fans []fanOut
	for i := range cfg.Reps {
		f, err := fanOutOnce(ctx, n)
		if err != nil {
			return fmt.Errorf("fan-out to %d: %w", n, err)
		}
		logf("  fan-out %d/%d: write %s, half %s, all %s, %d requests, %d deliver jobs (at most %d for one destination); CPU: PostgreSQL %s, relay %s",
			i+1, cfg.Reps, ms(f.write), secs(f.half), secs(f.all), f.requests, f.jobs, f.most, secs(f.pgCPU), secs(f.selfCPU))
		fans = append(fans, f)
	}
	var few, many []idleAt
	for i := range cfg.Reps {
		// Interleaved, so a noisy minute falls on both.
		a, err := idleBeside(ctx, healthy, 0, 0, cfg.EndpointsRate, cfg.IdleWindow, cfg.LatencyDuration)
		if err != nil {
			return err
		}
		b, err := idleBeside(ctx, healthy, n-healthy, cfg.DownBacklog, cfg.EndpointsRate, cfg.IdleWindow, cfg.LatencyDuration)
		if err != nil {
			return err
		}
		logf("  idle %d/%d: %d endpoints: PG %.1f ms/s, relay %.1f ms/s, p99 %s; %d endpoints: PG %.1f ms/s, relay %.1f ms/s, p99 %s",
			i+1, cfg.Reps, healthy, a.cost.pgCPU, a.cost.selfCPU, ms(a.lat.p99), n, b.cost.pgCPU, b.cost.selfCPU, ms(b.lat.p99))
		few, many = append(few, a), append(many, b)
	}

	med := func(f func(fanOut) float64) float64 {
		var xs []float64
		for _, x := range fans {
			xs = append(xs, f(x))
		}
		return median(xs)
	}
	all := time.Duration(med(func(f fanOut) float64 { return float64(f.all) }))
	half := time.Duration(med(func(f fanOut) float64 { return float64(f.half) }))
	write := time.Duration(med(func(f fanOut) float64 { return float64(f.write) }))
	var jobs, most, requests int64
	for _, f := range fans {
		jobs, most, requests = max(jobs, f.jobs), max(most, f.most), max(requests, f.requests)
	}
	idle := func(xs []idleAt, f func(idleAt) float64) float64 {
		var v []float64
		for _, x := range xs {
			v = append(v, f(x))
		}
		return median(v)
	}
	cpu := func(x idleAt) float64 { return x.cost.pgCPU + x.cost.selfCPU }
	p99 := func(x idleAt) float64 { return float64(x.lat.p99) }
	cpuFew, cpuMany := idle(few, cpu), idle(many, cpu)
	p99Few, p99Many := time.Duration(idle(few, p99)), time.Duration(idle(many, p99))

	var b strings.Builder
	fmt.Fprintf(&b, "A service with one endpoint per customer. Relay in this process at `relay.DefaultConfig()`, one receiver answering 204 at once, fresh database per run; medians of %d runs.\n\n", cfg.Reps)
	fmt.Fprintf(&b, "**One order to %s endpoints**, all subscribed to `order.placed`:\n\n", commas(int64(n)))
	pgUsed := time.Duration(med(func(f fanOut) float64 { return float64(f.pgCPU) }))
	selfUsed := time.Duration(med(func(f fanOut) float64 { return float64(f.selfCPU) }))
	b.WriteString("| the order's transaction (fan-out write) | half the endpoints had it | every endpoint had it | requests | deliver jobs (most for one destination) | CPU meanwhile: PostgreSQL, relay and receiver |\n|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| %s | %s | %s | %s | %s (%d) | %s, %s |\n\n", ms(write), secs(half), secs(all), commas(requests), commas(jobs), most, secs(pgUsed), secs(selfUsed))
	fmt.Fprintf(&b, "**Idle cost beside endpoints that are down.** %d healthy endpoints; beside them, in the second row, %s more that refuse connections and back off, %d pending messages each, their next probes spread over the hour. CPU per second of PostgreSQL and of the relay over %s with nothing due; then orders at %d/s for %s, commit to the last of the %d healthy endpoints' webhooks.\n\n",
		healthy, commas(int64(n-healthy)), cfg.DownBacklog, cfg.IdleWindow, cfg.EndpointsRate, cfg.LatencyDuration, healthy)
	b.WriteString("| endpoints | PostgreSQL CPU | relay CPU | deliver jobs/s idle | p50 | p99 |\n|---|---:|---:|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		xs   []idleAt
	}{{fmt.Sprintf("%d healthy", healthy), few}, {fmt.Sprintf("%d healthy + %s down", healthy, commas(int64(n-healthy))), many}} {
		fmt.Fprintf(&b, "| %s | %.1f ms/s | %.1f ms/s | %.1f | %s | %s |\n", row.name,
			idle(row.xs, func(x idleAt) float64 { return x.cost.pgCPU }), idle(row.xs, func(x idleAt) float64 { return x.cost.selfCPU }),
			idle(row.xs, func(x idleAt) float64 { return x.cost.deliverJobs }),
			ms(time.Duration(idle(row.xs, func(x idleAt) float64 { return float64(x.lat.p50) }))), ms(time.Duration(idle(row.xs, p99))))
	}
	rep.section("13. Many endpoints", b.String())

	rep.target(fmt.Sprintf("one order to %s endpoints: every endpoint has its webhook", commas(int64(n))), "≤ 10 s", secs(all), all <= 10*time.Second)
	rep.target(fmt.Sprintf("one order to %s endpoints: deliver jobs", commas(int64(n))), "one per destination", fmt.Sprintf("%s (at most %d for one)", commas(jobs), most), most <= 1)
	ratio := cpuMany / cpuFew
	rep.target(fmt.Sprintf("idle CPU (PostgreSQL + relay), %d healthy beside %s down vs alone", healthy, commas(int64(n-healthy))), "≤ 2×",
		fmt.Sprintf("%.2f× (%.1f vs %.1f ms/s)", ratio, cpuMany, cpuFew), ratio <= 2)
	rep.target("commit-to-delivery p99 at the healthy endpoints, beside the down ones vs alone", "≤ 2× + 100 ms",
		fmt.Sprintf("%s vs %s", ms(p99Many), ms(p99Few)), p99Many <= 2*p99Few+100*time.Millisecond)
	return nil
}
