package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// scenarioBacklog drains a backlog as an outage leaves it, millions of
// messages waiting for one endpoint, with the relay as the product wires it
// (db.ConfigurePool: JIT off) and with the same relay on a pool at the
// server's defaults (jit=on in the URL, which ConfigurePool leaves alone).
// Each run delivers for a fixed window; runs alternate, so the backlog they
// find shrinks alike.
func scenarioBacklog(ctx context.Context, cfg config, rep *report) error {
	e, err := newDrainEnv(ctx, 1)
	if err != nil {
		return err
	}
	defer e.close()
	if err := preloadPending(ctx, e.watch, cfg.Backlog); err != nil {
		return err
	}
	defaults, err := withParam(e.db.url, "jit", "on")
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, defaults)
	if err != nil {
		return err
	}
	var available bool // a JIT provider is installed (and jit is on)
	err = conn.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available)
	_ = conn.Close(ctx)
	if err != nil {
		return err
	}
	type variant struct{ name, url string }
	variants := []variant{{"the product's pool (`jit=off`)", e.db.url}, {"the server's defaults (`jit=on`)", defaults}}
	if !available {
		variants = variants[:1]
	}
	samples := map[string][]float64{}
	delivered := func() (n int64, err error) {
		err = e.watch.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`).Scan(&n)
		return n, err
	}
	for range cfg.Reps {
		for _, v := range variants {
			before, err := delivered()
			if err != nil {
				return err
			}
			r, err := startRelay(ctx, v.url, relaySetup{Config: relay.DefaultConfig(), Transport: httpTransport()})
			if err != nil {
				return err
			}
			time.Sleep(cfg.BacklogWindow) // the measured window, not a wait for a condition
			r.stop()
			after, err := delivered()
			if err != nil {
				return err
			}
			got := float64(after-before) / cfg.BacklogWindow.Seconds()
			samples[v.name] = append(samples[v.name], got)
			logf("  %s: %s msgs/s", v.name, rate(got))
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "A backlog of **%s pending messages for one endpoint** (each the one delivery of its own event, ~300-byte order payloads, seeded in one statement, then `VACUUM ANALYZE` as autovacuum would), as an outage of the endpoint leaves it, delivered when the endpoint is back: the real relay (`relay.New` + `Relay.Start`, `relay.DefaultConfig()`, a 20-connection pool, HTTP to the loopback receiver answering 204 at once) runs for %s and the messages it delivered are counted; %d runs of each, alternating, medians. "+
		"The relay's pool as the product makes it (`db.ConfigurePool`, which turns JIT off) against the same relay on a pool at the server's defaults (`jit=on`). "+
		"PostgreSQL JIT-compiles a statement whose estimated cost passes `jit_above_cost`, and the claim's estimate follows its destination's backlog (its generic plan takes the LIMIT as a tenth of the rows), not the 32 index entries it reads: from about 150,000 waiting messages every claim is compiled first, and past about 750,000 with inlining and optimization, some 400 ms per claim.\n\n",
		commas(int64(cfg.Backlog)), cfg.BacklogWindow, cfg.Reps)
	if !available {
		b.WriteString("This server has no JIT provider: only the product's pool was measured.\n\n")
	}
	b.WriteString("| relay pool | msgs/s | vs the product's |\n|---|---:|---:|\n")
	product := median(samples[variants[0].name])
	for _, v := range variants {
		m := median(samples[v.name])
		fmt.Fprintf(&b, "| %s | %s | %.3f |\n", v.name, rate(m), m/product)
	}
	rep.section("12. Draining after an outage", b.String())
	rep.results["backlog.product"] = product
	return nil
}

// withParam returns the database URL u with the run-time parameter name set.
func withParam(u, name, value string) (string, error) {
	p, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	q := p.Query()
	q.Set(name, value)
	p.RawQuery = q.Encode()
	return p.String(), nil
}
