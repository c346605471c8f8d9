package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// failingReceivers starts n loopback endpoints that fail as receivers do:
// half accept and never answer (the relay waits out its delivery timeout),
// half refuse connections (a port just closed). It returns their URLs and
// what stops the hanging ones.
func failingReceivers(n int) (urls []string, stop func(), err error) {
	release := make(chan struct{})
	var servers []*http.Server
	stop = func() {
		close(release)
		for _, s := range servers {
			_ = s.Close()
		}
	}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, err
		}
		url := "http://" + ln.Addr().String() + "/hook"
		if i%2 == 1 {
			_ = ln.Close() // refusing
			urls = append(urls, url)
			continue
		}
		srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})}
		go srv.Serve(ln) //nolint:errcheck
		servers = append(servers, srv)
		urls = append(urls, url)
	}
	return urls, stop, nil
}

// scenarioIsolation is the head-of-line table at the defaults: a healthy
// endpoint's commit-to-delivery latency with 0, 2 and 10 failing endpoints
// subscribed to the same orders, each receiving every order.
func scenarioIsolation(ctx context.Context, cfg config, rep *report) error {
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
	failing, stopFailing, err := failingReceivers(10)
	if err != nil {
		return err
	}
	svc := orders.NewService(pool, discard)
	r, err := startRelay(ctx, db.url, relaySetup{Config: relay.DefaultConfig(), Transport: httpTransport()})
	if err != nil {
		stopFailing()
		return err
	}
	// The hanging receivers let go first, so the relay's stop need not wait
	// out their delivery timeout.
	defer func() { stopFailing(); r.stop() }()
	if _, err := openLoop(ctx, svc, rc, 50, time.Second); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	type row struct {
		failing int
		res     latencyResult
	}
	var rows []row
	added := 0
	for _, n := range []int{0, 2, 10} {
		for ; added < n; added++ {
			if err := addEndpoints(ctx, pool, 1, failing[added]); err != nil {
				return err
			}
		}
		res, err := openLoop(ctx, svc, rc, cfg.IsolationRate, cfg.IsolationDuration)
		if err != nil {
			return fmt.Errorf("%d failing endpoints: %w", n, err)
		}
		logf("  %d failing: p50 %s p99 %s max %s", n, ms(res.p50), ms(res.p99), ms(res.max))
		rows = append(rows, row{n, res})
	}
	var failed, waiting, tried, attempts int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE m.status = 'failed'),
		count(*) FILTER (WHERE m.status = 'pending'), count(*) FILTER (WHERE m.attempts > 0), coalesce(sum(m.attempts), 0)
		FROM outbox_messages m JOIN webhook_endpoints e ON e.id = m.destination WHERE e.url <> $1`, rc.url).
		Scan(&failed, &waiting, &tried, &attempts); err != nil {
		return err
	}

	var b strings.Builder
	fmt.Fprintf(&b, "A healthy endpoint's commit-to-delivery latency (as in section 3: open loop, `orders.Service.Place` returning to the receiver's handler starting) at %d orders/s for %s per row, "+
		"while 0, 2 and then 10 failing endpoints are subscribed to the same orders, each receiving all %d events/s: half accept the connection and never answer, half refuse it. "+
		"One relay at `relay.DefaultConfig()` (only what to reach is set), real HTTP on loopback.\n\n",
		cfg.IsolationRate, cfg.IsolationDuration, cfg.IsolationRate)
	b.WriteString("| failing endpoints | orders | p50 | p95 | p99 | max | p99 vs none |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	base := rows[0].res.p99
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %s | %.2f |\n", r.failing, r.res.placed, ms(r.res.p50), ms(r.res.p95), ms(r.res.p99), ms(r.res.max),
			float64(r.res.p99)/float64(base))
	}
	fmt.Fprintf(&b, "\nThe failing endpoints' %s messages: %s waiting, %d failed; %s of them tried, %s attempts in all: each endpoint backs off as a whole after %d endpoint-wide failures, and its waiting messages spend no attempts.\n",
		commas(waiting+failed), commas(waiting), failed, commas(tried), commas(attempts), relay.DefaultConfig().CircuitThreshold)
	rep.section("8. Head-of-line isolation at the defaults", b.String())

	bound := 2*base + 100*time.Millisecond
	worst := max(rows[1].res.p99, rows[2].res.p99)
	rep.target("Healthy p99 beside 2 and 10 failing endpoints, defaults", "≤ 2 × alone + 100 ms",
		fmt.Sprintf("%s and %s vs %s alone", ms(rows[1].res.p99), ms(rows[2].res.p99), ms(base)), worst <= bound)
	return nil
}
