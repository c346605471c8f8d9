package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// enqueue commits n events of type typ in one transaction with the real
// outbox.Enqueue, and returns the events' ids.
func (l *lab) enqueue(typ string, n int, data func(i int) any) ([]uuid.UUID, error) {
	var all []uuid.UUID
	err := pgx.BeginFunc(l.ctx, l.pool, func(tx pgx.Tx) error {
		for i := range n {
			id, err := outbox.Enqueue(l.ctx, tx, outbox.Event{Type: typ, Data: data(i)})
			if err != nil {
				return err
			}
			all = append(all, id)
		}
		return nil
	})
	return all, err
}

// leaseWatch sees, from the relays' side, which relay sends to which
// endpoint, and whether two relays ever have requests in flight to one
// endpoint at once.
type leaseWatch struct {
	mu       sync.Mutex
	inFlight map[string]*[2]int // by endpoint URL, by relay
	served   [2]map[string]bool
	sent     [2]int64
	overlaps int64
}

func newLeaseWatch() *leaseWatch {
	return &leaseWatch{inFlight: map[string]*[2]int{}, served: [2]map[string]bool{{}, {}}}
}

// transport is relay number i's transport (0 is A, 1 is B), watched.
func (w *leaseWatch) transport(i int) relay.Transport {
	return watchedTransport{Transport: httpTransport(), watch: w, relay: i}
}

type watchedTransport struct {
	relay.Transport
	watch *leaseWatch
	relay int
}

func (t watchedTransport) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	w := t.watch
	w.mu.Lock()
	n := w.inFlight[d.URL]
	if n == nil {
		n = &[2]int{}
		w.inFlight[d.URL] = n
	}
	if n[1-t.relay] > 0 {
		w.overlaps++
	}
	n[t.relay]++
	w.served[t.relay][d.URL] = true
	w.mu.Unlock()
	res := t.Transport.Deliver(ctx, d)
	w.mu.Lock()
	n[t.relay]--
	if res.Err == nil && res.StatusCode/100 == 2 {
		w.sent[t.relay]++
	}
	w.mu.Unlock()
	return res
}

// receiverWork is what each webhook costs lab 4's receiver: enough that
// sending, not the database, sets the pace, so one relay waiting for the
// other shows in the time.
const receiverWork = 2 * time.Millisecond

func lab4(l *lab) (*Report, error) {
	n := l.size(500)
	rc := newReceiver()
	rc.respond = func(*http.Request, []byte) int {
		time.Sleep(receiverWork) // the receiver's own work on each webhook
		return http.StatusNoContent
	}
	srv, err := l.serve(rc)
	if err != nil {
		return nil, err
	}
	data := func(i int) any { return map[string]int{"n": i} }
	r := newReport("Lab 4: two relays: without a claim, with a lock, with SKIP LOCKED, and the outbox relay")

	// fresh empties the outbox and enqueues n messages, one to each
	// endpoint in turn.
	fresh := func(endpoints int) error {
		if _, err := l.pool.Exec(l.ctx, "TRUNCATE outbox_messages, outbox_events CASCADE; DELETE FROM webhook_endpoints"); err != nil {
			return err
		}
		rc.reset()
		for e := range endpoints {
			if _, err := l.endpoint(fmt.Sprintf("%s/endpoint-%d", srv.URL, e+1), fmt.Sprintf("order.placed.%d", e+1)); err != nil {
				return err
			}
			if _, err := l.enqueue(fmt.Sprintf("order.placed.%d", e+1), n/endpoints, data); err != nil {
				return err
			}
		}
		return nil
	}
	// naive runs two naive relays to the end and reports them.
	naive := func(key, heading, dupNote, timeNote string, relays [2]func(*atomic.Int64) error) error {
		if err := fresh(1); err != nil {
			return err
		}
		var sent [2]atomic.Int64
		var errs [2]error
		var wg sync.WaitGroup
		start := time.Now()
		for i := range relays {
			wg.Go(func() { errs[i] = relays[i](&sent[i]) })
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for waiting := true; waiting; {
			select {
			case <-done:
				waiting = false
			case <-time.After(100 * time.Millisecond):
			}
			d, u, _ := rc.counts()
			l.p.Status("%s · %d webhooks received", countText(u, int64(n), "messages"), d)
		}
		if err := errors.Join(errs[:]...); err != nil {
			return err
		}
		took := time.Since(start)
		d, u, _ := rc.counts()
		r.Section(heading)
		if key == "naive" {
			r.Count(key+".messages", "messages", int64(n), "")
			r.Count(key+".received", "webhooks received", d, "")
		}
		r.Counts[key+".unique"] = u
		r.Count(key+".duplicates", "duplicates", d-u, dupNote)
		r.Text(key+".split", "sent by relay A / relay B", fmt.Sprintf("%d / %d", sent[0].Load(), sent[1].Load()), "")
		r.Duration(key+".time", "time", took, timeNote)
		return nil
	}

	l.p.Step("two relays without a claim: each SELECTs pending rows, sends them, then UPDATEs them to delivered")
	err = naive("naive", "without a claim: SELECT ... WHERE status = 'pending', send, UPDATE",
		"both relays read the same rows before either marked them", "",
		[2]func(*atomic.Int64) error{
			func(sent *atomic.Int64) error { return naiveRelayNoClaim(l.ctx, l.pool, httpTransport(), sent) },
			func(sent *atomic.Int64) error { return naiveRelayNoClaim(l.ctx, l.pool, httpTransport(), sent) },
		})
	if err != nil {
		return nil, err
	}
	locking := func(skipLocked bool) [2]func(*atomic.Int64) error {
		run := func(sent *atomic.Int64) error {
			lr := &lockingRelay{pool: l.pool, transport: httpTransport(), skipLocked: skipLocked, batch: 50, retryAfter: time.Second}
			err := lr.run(l.ctx)
			sent.Store(lr.sent.Load())
			return err
		}
		return [2]func(*atomic.Int64) error{run, run}
	}
	l.p.Step("two relays that lock what they send: SELECT ... FOR UPDATE, send, UPDATE, COMMIT")
	err = naive("lock", "a lock held while sending: SELECT ... FOR UPDATE, send, UPDATE, COMMIT",
		"each row was locked by one relay", "each relay waited for the other's locks: they took turns", locking(false))
	if err != nil {
		return nil, err
	}
	l.p.Step("two relays that skip what the other locked: SELECT ... FOR UPDATE SKIP LOCKED, send, UPDATE, COMMIT")
	err = naive("skip", "with SKIP LOCKED: SELECT ... FOR UPDATE SKIP LOCKED, send, UPDATE, COMMIT",
		"each row was locked by one relay", "each relay took the rows the other had not locked", locking(true))
	if err != nil {
		return nil, err
	}

	// The outbox relay: a lease per endpoint, then the claim.
	const endpoints = 4
	if err := fresh(endpoints); err != nil {
		return nil, err
	}
	total := int64(endpoints * (n / endpoints))
	l.p.Step("two outbox relays (two River clients, each serving 2 endpoints at a time) on %d endpoints: a lease per endpoint, then the claim", endpoints)
	cfg := labRelayConfig()
	// Each relay serves two endpoints at once: with four, neither can take
	// them all, so both have work from the start.
	cfg.DeliverWorkers = 2
	watch := newLeaseWatch()
	start := time.Now()
	for i := range 2 {
		if _, err := l.startRelay(cfg, watch.transport(i)); err != nil {
			return nil, err
		}
	}
	err = l.waitFor(time.Minute, "every message delivered", func() (bool, string, error) {
		s, err := l.stats()
		d, _, _ := rc.counts()
		return s.Delivered == total, fmt.Sprintf("%s · %d webhooks received", countText(s.Delivered, total, "delivered"), d), err
	})
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	d, u, _ := rc.counts()
	watch.mu.Lock()
	sentA, sentB, servedA, servedB, overlaps := watch.sent[0], watch.sent[1], len(watch.served[0]), len(watch.served[1]), watch.overlaps
	watch.mu.Unlock()
	r.Section("the outbox relay: a lease per endpoint, then the claim, UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)")
	r.Count("relay.endpoints", "endpoints", endpoints, "")
	r.Counts["relay.unique"] = u
	r.Count("relay.duplicates", "duplicates", d-u, "each row was claimed by one relay")
	r.Text("relay.split", "sent by relay A / relay B", fmt.Sprintf("%d / %d", sentA, sentB), "")
	r.Text("relay.served", "endpoints relay A / relay B served", fmt.Sprintf("%d / %d", servedA, servedB), "")
	r.Count("relay.overlaps", "sent to one endpoint by both at once", overlaps, "its lease: one relay serves an endpoint at a time")
	r.Duration("relay.time", "time", took, "")
	r.Counts["relay.sent_a"], r.Counts["relay.sent_b"] = sentA, sentB
	r.Counts["relay.served_a"], r.Counts["relay.served_b"] = int64(servedA), int64(servedB)

	r.Verdict("Without a claim, a second relay doubles the traffic instead of sharing it: %d duplicates.", r.Counts["naive.duplicates"])
	r.Verdict("A lock held while sending stops them, but the relays take turns: %s, against %s with SKIP LOCKED.",
		r.Texts["lock.time"], r.Texts["skip.time"])
	r.Verdict("The outbox relay leases each endpoint to one relay at a time, then claims its rows with SKIP LOCKED:")
	r.Verdict("the relays share the endpoints, not one endpoint's rows, so each endpoint keeps one order and one pace.")
	c := r.Counts
	switch {
	case c["naive.duplicates"] == 0:
		return r, fmt.Errorf("%w: lab 4 expects duplicates without a claim", errInvariant)
	case c["lock.duplicates"] != 0 || c["skip.duplicates"] != 0 || c["relay.duplicates"] != 0 || c["relay.overlaps"] != 0:
		return r, fmt.Errorf("%w: lab 4 expects no duplicates with a lock, and one relay per endpoint at a time", errInvariant)
	case c["lock.unique"] != int64(n) || c["skip.unique"] != int64(n) || c["relay.unique"] != total:
		return r, fmt.Errorf("%w: lab 4 expects every message delivered", errInvariant)
	}
	return r, nil
}

func lab5(l *lab) (*Report, error) {
	n := l.size(50)
	rc := newReceiver()
	srv, err := l.serve(rc)
	if err != nil {
		return nil, err
	}
	if _, err := l.endpoint(srv.URL, "order.placed"); err != nil {
		return nil, err
	}
	if _, err := l.enqueue("order.placed", n, func(i int) any { return map[string]int{"n": i} }); err != nil {
		return nil, err
	}
	cfg := labRelayConfig()
	relayTimeout := relay.DefaultConfig().RelayTimeout
	l.p.Step("a relay process claims messages to send and is SIGKILLed before sending any")
	killed, err := l.spawn("relay", relaySpec{DatabaseURL: l.url, Config: cfg, DieAfterSends: 0}, func(string) {})
	if err != nil {
		return nil, err
	}
	if !killed {
		return nil, fmt.Errorf("the relay process exited without being killed")
	}
	died := time.Now()
	claimed, err := l.count("SELECT count(*) FROM outbox_messages WHERE status = 'claimed'")
	if err != nil {
		return nil, err
	}

	l.p.Step("a healthy relay starts; the dead relay's claims, and its endpoint, are its own until its heartbeat is %s old", seconds(relayTimeout))
	if _, err := l.startRelay(cfg, nil); err != nil {
		return nil, err
	}
	var firstDelivery time.Duration
	err = l.waitFor(time.Minute, "every message delivered", func() (bool, string, error) {
		s, err := l.stats()
		if s.Delivered > 0 && firstDelivery == 0 {
			firstDelivery = time.Since(died)
		}
		return s.Delivered == int64(n), fmt.Sprintf("claimed (held by the dead relay) %d · pending %d · delivered %d · %s since the relay died",
			s.Claimed, s.Pending, s.Delivered, seconds(time.Since(died))), err
	})
	if err != nil {
		return nil, err
	}
	var released int64
	var held float64
	if err := l.pool.QueryRow(l.ctx, `SELECT count(*), COALESCE(max(extract(epoch FROM finished_at - started_at)), 0)::float8
		FROM outbox_attempts WHERE outcome = 'interrupted'`).Scan(&released, &held); err != nil {
		return nil, err
	}
	d, u, _ := rc.counts()
	r := newReport("Lab 5: a relay dies holding claims")
	r.Count("messages", "messages", int64(n), "")
	r.Count("claimed", "claimed by the relay that died", claimed, "as many as its pace let it send at once: no other relay touches them")
	r.Duration("timeout", "relay timeout", relayTimeout, "a heartbeat older than this means dead")
	r.Duration("held", "longest claim held", time.Duration(held*float64(time.Second)), "from the claim to its release")
	r.Count("released", "released when it was declared dead", released, "recorded as an 'interrupted' attempt")
	r.Duration("first", "first delivery after the death", firstDelivery, "")
	r.Count("delivered", "delivered", u, "")
	r.Count("lost", "lost", int64(n)-u, "")
	r.Count("duplicates", "duplicates", d-u, "the dead relay had sent nothing")
	r.Verdict("A dead relay's claims are released as soon as the others see its heartbeat stop, and delivered.")
	r.Verdict("The claim timeout (%s) is only the last resort, for a relay that is alive but stuck.", seconds(relay.DefaultConfig().ClaimTimeout))
	if claimed == 0 || released != claimed || u != int64(n) || held < relayTimeout.Seconds()/2 || held > 3*relayTimeout.Seconds() {
		return r, fmt.Errorf("%w: lab 5's invariants do not hold", errInvariant)
	}
	return r, nil
}

func lab6(l *lab) (*Report, error) {
	n := l.size(50)
	var mu sync.Mutex
	fixed := false
	rc := newReceiver()
	rc.respond = func(_ *http.Request, body []byte) int {
		mu.Lock()
		defer mu.Unlock()
		if bytes.Contains(body, []byte(`"XXX"`)) && !fixed {
			return http.StatusUnprocessableEntity
		}
		return http.StatusNoContent
	}
	srv, err := l.serve(rc)
	if err != nil {
		return nil, err
	}
	if _, err := l.endpoint(srv.URL, "order.placed"); err != nil {
		return nil, err
	}
	poisonEvent, err := l.enqueue("order.placed", 1, func(int) any { return map[string]any{"order": "p-1", "currency": "XXX"} })
	if err != nil {
		return nil, err
	}
	var poison uuid.UUID // its one delivery
	if err := l.pool.QueryRow(l.ctx, "SELECT id FROM outbox_messages WHERE event_id = $1", poisonEvent[0]).Scan(&poison); err != nil {
		return nil, err
	}
	if _, err := l.enqueue("order.placed", n, func(i int) any { return map[string]any{"order": i, "currency": "EUR"} }); err != nil {
		return nil, err
	}
	cfg := labRelayConfig()
	cfg.MaxAttempts = 4
	l.p.Step("relaying 1 poison message (the receiver answers 422 to it) and %d healthy ones; attempt cap %d", n, cfg.MaxAttempts)
	start := time.Now()
	if _, err := l.startRelay(cfg, nil); err != nil {
		return nil, err
	}
	svc := l.admin()
	var healthyAt, failedAt time.Duration
	var healthyWhenFailed int64
	err = l.waitFor(time.Minute, "the poison message to fail and the rest to be delivered", func() (bool, string, error) {
		m, err := svc.Message(l.ctx, poison)
		if err != nil {
			return false, "", err
		}
		s, err := l.stats()
		if err != nil {
			return false, "", err
		}
		healthy := s.Delivered
		if healthy == int64(n) && healthyAt == 0 {
			healthyAt = time.Since(start)
		}
		if m.Status == outbox.StatusFailed && failedAt == 0 {
			failedAt, healthyWhenFailed = time.Since(start), healthy
		}
		return healthyAt > 0 && failedAt > 0, fmt.Sprintf("healthy %s · poison: %s after %d attempts",
			countText(healthy, int64(n), "delivered"), m.Status, m.Attempts), nil
	})
	if err != nil {
		return nil, err
	}
	m, err := svc.Message(l.ctx, poison)
	if err != nil {
		return nil, err
	}

	l.p.Step("the receiver is fixed; a person requeues the failed message (POST /outbox/messages/{id}/retry)")
	mu.Lock()
	fixed = true
	mu.Unlock()
	if _, err := svc.Retry(l.ctx, poison); err != nil {
		return nil, err
	}
	err = l.waitFor(30*time.Second, "the requeued message delivered", func() (bool, string, error) {
		m, err := svc.Message(l.ctx, poison)
		return err == nil && m.Status == outbox.StatusDelivered, "poison message: " + m.Status, err
	})
	if err != nil {
		return nil, err
	}
	after, err := svc.Message(l.ctx, poison)
	if err != nil {
		return nil, err
	}
	r := newReport("Lab 6: a poison message")
	healthyDelivered, err := l.count("SELECT count(*) FROM outbox_messages WHERE status = 'delivered' AND event_id <> $1", poisonEvent[0])
	if err != nil {
		return nil, err
	}
	r.OutOf("healthy", "healthy messages delivered", healthyDelivered, int64(n), "")
	r.Duration("healthy_at", "all healthy delivered after", healthyAt, "")
	r.Text("poison_status", "poison message", m.Status, fmt.Sprintf("after %d attempts (the cap is %d)", m.Attempts, cfg.MaxAttempts))
	r.Counts["poison_attempts"] = int64(m.Attempts)
	r.Duration("failed_at", "poison failed after", failedAt, "")
	r.Count("healthy_when_failed", "healthy delivered by then", healthyWhenFailed, "")
	r.Text("poison_error", "its last error", m.LastError, "")
	r.Text("after_retry", "after the fix and a requeue", after.Status, fmt.Sprintf("attempt %d", after.Attempts))
	r.Verdict("The poison message backed off on its own row and stopped at the cap; the others flowed past it.")
	r.Verdict("A failed row waits for a person, who fixes the cause and requeues it: nothing is dropped.")
	if r.Counts["healthy"] != int64(n) || m.Status != outbox.StatusFailed || m.Attempts != cfg.MaxAttempts || after.Status != outbox.StatusDelivered {
		return r, fmt.Errorf("%w: lab 6's invariants do not hold", errInvariant)
	}
	return r, nil
}

func lab9(l *lab) (*Report, error) {
	n := l.size(30)
	window := l.opts.Window
	if window == 0 {
		window = 2 * time.Second
	}
	const timeout = 250 * time.Millisecond
	healthy := newReceiver()
	hsrv, err := l.serve(healthy)
	if err != nil {
		return nil, err
	}
	down := newReceiver()
	down.respond = func(r *http.Request, _ []byte) int {
		<-r.Context().Done() // accepts the connection, never answers
		return http.StatusServiceUnavailable
	}
	dsrv, err := l.serve(down)
	if err != nil {
		return nil, err
	}
	for _, u := range []string{hsrv.URL, dsrv.URL} {
		if _, err := l.endpoint(u, "order.placed"); err != nil {
			return nil, err
		}
	}
	data := func(i int) any { return map[string]int{"n": i} }
	r := newReport("Lab 9: head-of-line blocking")
	watch := func(label string) time.Duration {
		start := time.Now()
		var all time.Duration
		for time.Since(start) < window {
			time.Sleep(20 * time.Millisecond)
			_, u, _ := healthy.counts()
			if u == int64(n) && all == 0 {
				all = time.Since(start)
			}
			_, _, reqs := down.counts()
			l.p.Status("%s: healthy receiver %s · down receiver %d requests · %s of %s", label, countText(u, int64(n), "delivered"),
				reqs, seconds(time.Since(start)), seconds(window))
		}
		return all
	}
	report := func(prefix string, all time.Duration) {
		_, u, _ := healthy.counts()
		_, _, reqs := down.counts()
		r.OutOf(prefix+".healthy", "healthy receiver: delivered within "+seconds(window), u, int64(n), "")
		if all > 0 {
			r.Duration(prefix+".all", "all healthy delivered after", all, "")
		} else {
			r.Text(prefix+".all", "all healthy delivered after", "not within "+seconds(window), "")
		}
		r.Count(prefix+".down", "requests to the down receiver", reqs, "each waits out the "+timeout.String()+" timeout")
	}

	// Without isolation.
	if _, err := l.enqueue("order.placed", n, data); err != nil {
		return nil, err
	}
	l.p.Step("without isolation: one queue, oldest first, one delivery at a time (%d events to a healthy and a hanging receiver)", n)
	ctx, cancel := context.WithCancel(l.ctx)
	errc := make(chan error, 1)
	go func() { errc <- naiveRelaySingleQueue(ctx, l.pool, httpTransport(), timeout, time.Second) }()
	all := watch("single queue")
	cancel()
	if err := <-errc; err != nil {
		return nil, err
	}
	r.Section("without isolation: one queue, oldest first")
	report("naive", all)

	// With isolation: the real relay.
	if _, err := l.pool.Exec(l.ctx, "TRUNCATE outbox_messages, outbox_events CASCADE"); err != nil {
		return nil, err
	}
	healthy.reset()
	down.reset()
	if _, err := l.enqueue("order.placed", n, data); err != nil {
		return nil, err
	}
	l.p.Step("with isolation: the outbox relay (a deliver job per destination, which backs off as a whole when it fails)")
	cfg := labRelayConfig()
	cfg.DeliveryTimeout = timeout
	cfg.BackoffBase, cfg.BackoffMax = time.Second, 5*time.Second
	stop, err := l.startRelay(cfg, nil)
	if err != nil {
		return nil, err
	}
	all = watch("outbox relay")
	stop()
	r.Section("with isolation: the outbox relay, per destination")
	report("isolated", all)
	r.Verdict("One hanging receiver held the single queue: each of its messages cost a timeout, and the")
	r.Verdict("healthy receiver's messages waited behind them. Per destination, the healthy one never waits.")
	if r.Counts["isolated.healthy"] != int64(n) || r.Counts["naive.healthy"] >= int64(n) {
		return r, fmt.Errorf("%w: lab 9 expects the single queue to fall behind and the outbox relay not to", errInvariant)
	}
	return r, nil
}
