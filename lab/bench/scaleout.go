package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// childEnv, when set, makes this binary (or the test binary) a relay
// process for the scale-out scenario: it runs the relay on the database
// in childURLEnv until its stdin closes.
const (
	childEnv    = "OUTBOXKIT_BENCH_CHILD"
	childURLEnv = "OUTBOXKIT_BENCH_DATABASE_URL"
	// childStarted is the line a relay process writes to its stdout once
	// its relay has started (Relay.Start returned).
	childStarted = "started"
)

func runChild() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := startRelay(ctx, os.Getenv(childURLEnv), relaySetup{Config: relay.DefaultConfig(), Transport: httpTransport()})
	if err != nil {
		return err
	}
	// Started: the parent's clock starts once every relay has said so.
	fmt.Println(childStarted)
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop() }()
	<-ctx.Done()
	r.stop()
	return nil
}

// relayGroup is n relays: processes, or River clients in this process.
type relayGroup struct {
	procs  []*exec.Cmd
	stdins []io.Closer
	inproc []*runningRelay
	// started receives one error (nil) per process once its relay has
	// started, or failed to.
	started chan error
	// read is closed, per process, once its stdout has been read to the
	// end: exec.Cmd.Wait closes the pipe, so it must come after.
	read []chan struct{}
}

// waitStarted waits until every relay of the group has started: its
// process is past Relay.Start (registered, River's client running, its
// loops going). Relays in this process have by the time startRelays
// returns.
func (g *relayGroup) waitStarted(ctx context.Context) error {
	timeout := time.After(time.Minute)
	for range g.procs {
		select {
		case err := <-g.started:
			if err != nil {
				return err
			}
		case <-timeout:
			return errors.New("relay processes not started after a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// cpu is the CPU the group's processes have used so far; for relays in
// this process, this process's (the receiver's included).
func (g *relayGroup) cpu() time.Duration {
	if len(g.procs) == 0 {
		return selfCPU()
	}
	var t time.Duration
	for _, p := range g.procs {
		t += pidCPU(p.Process.Pid)
	}
	return t
}

func startRelays(ctx context.Context, url string, n int, procs bool) (*relayGroup, error) {
	g := &relayGroup{started: make(chan error, n)}
	for range n {
		if !procs {
			r, err := startRelay(ctx, url, relaySetup{Config: relay.DefaultConfig(), Transport: httpTransport()})
			if err != nil {
				g.stop()
				return nil, err
			}
			g.inproc = append(g.inproc, r)
			continue
		}
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), childEnv+"=relay", childURLEnv+"="+url)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			g.stop()
			return nil, err
		}
		read := make(chan struct{})
		go func() {
			defer close(read)
			sc := bufio.NewScanner(out)
			if sc.Scan() && sc.Text() == childStarted {
				g.started <- nil
			} else {
				g.started <- fmt.Errorf("relay process %d exited before starting", cmd.Process.Pid)
			}
			_, _ = io.Copy(os.Stderr, out)
		}()
		g.procs, g.stdins, g.read = append(g.procs, cmd), append(g.stdins, in), append(g.read, read)
	}
	return g, nil
}

func (g *relayGroup) stop() {
	for _, r := range g.inproc {
		r.stop()
	}
	for _, in := range g.stdins {
		_ = in.Close()
	}
	for i, p := range g.procs {
		done := make(chan struct{})
		go func() { <-g.read[i]; _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
}

func scenarioScaleOut(ctx context.Context, cfg config, rep *report) error {
	var b strings.Builder
	how := "each relay a **separate process** (this binary re-executed as a relay: its own pool of 20, its own River client, `relay.DefaultConfig()`, HTTP transport)"
	if !cfg.RelayProcs {
		how = "each relay a separate River client with its own pool of 20 **in this process**"
	}
	fmt.Fprintf(&b, "A drain as in section 2 (%s pending messages, real HTTP to the loopback receiver answering 204) with 1, 2 and 4 relays at once, %s. "+
		"The clock starts once every relay has started (its process past `Relay.Start`: registered, its River client running; what was delivered before is left out): a process starts once in its life. The receiver counts every request and every distinct `webhook-id`; duplicates = requests − distinct. "+
		"CPU per message, over the same span: the relay processes' (read from `/proc`) and this database's PostgreSQL backends'; noise disturbs it least, and it shows what the relays beyond the one serving a destination cost. Medians of %d runs.\n\n",
		commas(int64(cfg.ScaleDrain)), how, cfg.ScaleReps)
	var dupTotal, reqTotal, multiTotal int64
	var oneWorst float64
	// Over the drain's endpoints, and over one: one destination is served
	// by one deliver job at a time (its lease), so more relays cannot make
	// it faster, only must not make it slower or send anything twice.
	for _, endpoints := range []int{cfg.Endpoints, 1} {
		s, err := scaleOut(ctx, cfg, endpoints)
		if err != nil {
			return err
		}
		dupTotal += s.dups
		reqTotal += s.requests
		multiTotal += s.multi
		fmt.Fprintf(&b, "**%d endpoint(s).**\n\n| relays | msgs/s | vs 1 relay | relays' CPU per message | vs 1 relay | PostgreSQL CPU per message | vs 1 relay | duplicate deliveries (all runs) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n", endpoints)
		base := median(s.samples[cfg.Relays[0]])
		relayBase, pgBase := median(s.relayCPU[cfg.Relays[0]]), median(s.pgCPU[cfg.Relays[0]])
		for _, n := range cfg.Relays {
			ratio := median(s.samples[n]) / base
			relay, pg := median(s.relayCPU[n]), median(s.pgCPU[n])
			fmt.Fprintf(&b, "| %d | %s | %.2f | %.0f µs | %.2f | %.0f µs | %.2f | %d |\n", n, rate(median(s.samples[n])), ratio,
				relay, relay/relayBase, pg, pg/pgBase, s.dupsBy[n])
			if endpoints == 1 && n != cfg.Relays[0] && (oneWorst == 0 || ratio < oneWorst) {
				oneWorst = ratio
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "In all, %s requests, %d duplicates; %d messages were claimed more than once.\n", commas(reqTotal), dupTotal, multiTotal)
	rep.section("5. Scale-out", b.String())
	rep.target("Scale-out: duplicate deliveries without crashes", "0", fmt.Sprintf("%d of %s requests", dupTotal, commas(reqTotal)), dupTotal == 0)
	if oneWorst > 0 {
		// At least as fast as one relay, within the ±5 % that separates
		// two medians of the same case on this machine.
		rep.target("Scale-out, one destination: 2 and 4 relays vs 1", "≥ 0.95", fmt.Sprintf("%.2f at worst", oneWorst), oneWorst >= 0.95)
	}
	return nil
}

// scaled is one scale-out series: rates by relay count, and what the
// receiver and the table saw.
type scaled struct {
	samples               map[int][]float64
	relayCPU, pgCPU       map[int][]float64 // µs per message
	dupsBy                map[int]int64
	requests, dups, multi int64
}

func scaleOut(ctx context.Context, cfg config, endpoints int) (scaled, error) {
	s := scaled{samples: map[int][]float64{}, relayCPU: map[int][]float64{}, pgCPU: map[int][]float64{}, dupsBy: map[int]int64{}}
	e, err := newDrainEnv(ctx, endpoints)
	if err != nil {
		return s, err
	}
	defer e.close()
	for range cfg.ScaleReps {
		for _, n := range cfg.Relays {
			if err := e.prepare(ctx, cfg.ScaleDrain, e.fast.url); err != nil {
				return s, err
			}
			e.fast.reset(true, false)
			var since time.Time
			if err := e.watch.QueryRow(ctx, "SELECT now()").Scan(&since); err != nil {
				return s, err
			}
			g, err := startRelays(ctx, e.db.url, n, cfg.RelayProcs)
			if err != nil {
				return s, err
			}
			// The clock starts once every relay has started (registered,
			// its River client running): what a process costs to start is
			// paid once in its life, not per message. What was delivered
			// before counts for nothing.
			if err := g.waitStarted(ctx); err != nil {
				g.stop()
				return s, err
			}
			start, early, err := relaysUp(ctx, e.watch, n, since)
			if err != nil {
				g.stop()
				return s, err
			}
			relay0, pg := g.cpu(), watchDBCPU(ctx, e.watch)
			end, err := waitDrained(ctx, e.watch, drainLimit(cfg.ScaleDrain))
			relayUsed, pgUsed := g.cpu()-relay0, pg.total()
			g.stop()
			if err != nil {
				return s, fmt.Errorf("%d relays over %d endpoints: %w", n, endpoints, err)
			}
			msgs := float64(int64(cfg.ScaleDrain) - early)
			r := msgs / end.Sub(start).Seconds()
			req, distinct := e.fast.duplicates()
			var multi int64
			_ = e.watch.QueryRow(ctx, "SELECT count(*) FROM outbox_messages WHERE attempts > 1").Scan(&multi)
			// One event per preloaded message: as many distinct webhook-ids.
			if distinct != int64(cfg.ScaleDrain) {
				return s, fmt.Errorf("%d relays over %d endpoints: receiver saw %d distinct webhook-ids (events) of %d", n, endpoints, distinct, cfg.ScaleDrain)
			}
			s.samples[n] = append(s.samples[n], r)
			s.relayCPU[n] = append(s.relayCPU[n], float64(relayUsed.Microseconds())/msgs)
			s.pgCPU[n] = append(s.pgCPU[n], float64(pgUsed.Microseconds())/msgs)
			s.dupsBy[n] += req - distinct
			s.dups += req - distinct
			s.requests += req
			s.multi += multi
			logf("  %d relay(s), %d endpoint(s): %s msgs/s, %d requests, %d duplicates; CPU per message: relays %.0f µs, PostgreSQL %.0f µs",
				n, endpoints, rate(r), req, req-distinct, float64(relayUsed.Microseconds())/msgs, float64(pgUsed.Microseconds())/msgs)
		}
	}
	return s, nil
}

// relaysUp waits until n relays have registered since since, and returns
// when, with how many messages were delivered by then.
func relaysUp(ctx context.Context, pool *pgxpool.Pool, n int, since time.Time) (time.Time, int64, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		var up int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_relays WHERE started_at >= $1", since).Scan(&up); err != nil {
			return time.Time{}, 0, err
		}
		if up >= n {
			at := time.Now()
			delivered, err := countStatus(ctx, pool, "delivered")
			return at, delivered, err
		}
		if time.Now().After(deadline) {
			return time.Time{}, 0, fmt.Errorf("%d of %d relays up after a minute", up, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
