package main

import (
	"bytes"
	"context"
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

// countingTransport counts successful sends, to show how relays split work.
type countingTransport struct {
	relay.Transport
	sent atomic.Int64
}

func (t *countingTransport) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	res := t.Transport.Deliver(ctx, d)
	if res.Err == nil && res.StatusCode/100 == 2 {
		t.sent.Add(1)
	}
	return res
}

func lab4(l *lab) (*Report, error) {
	n := l.size(500)
	rc := newReceiver()
	srv, err := l.serve(rc)
	if err != nil {
		return nil, err
	}
	if _, err := l.endpoint(srv.URL, "order.placed"); err != nil {
		return nil, err
	}
	data := func(i int) any { return map[string]int{"n": i} }
	r := newReport("Lab 4: two relays, without and with a claim")

	// Without a claim.
	if _, err := l.enqueue("order.placed", n, data); err != nil {
		return nil, err
	}
	l.p.Step("two relays without a claim: each SELECTs pending rows, sends them, then UPDATEs them to delivered")
	var a, b atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 2)
	start := time.Now()
	for i, counter := range []*atomic.Int64{&a, &b} {
		wg.Go(func() { errs[i] = naiveRelayNoClaim(l.ctx, l.pool, httpTransport(), counter) })
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
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	naiveTime := time.Since(start)
	d, u, _ := rc.counts()
	r.Section("without a claim: SELECT ... WHERE status = 'pending', send, UPDATE")
	r.Count("naive.messages", "messages", int64(n), "")
	r.Count("naive.received", "webhooks received", d, "")
	r.Count("naive.unique", "distinct messages received", u, "")
	r.Count("naive.duplicates", "duplicates", d-u, "both relays read the same rows before either marked them")
	r.Text("naive.split", "sent by relay A / relay B", fmt.Sprintf("%d / %d", a.Load(), b.Load()), "")
	r.Duration("naive.time", "time", naiveTime, "")

	// With the claim: the real relay, twice.
	if _, err := l.pool.Exec(l.ctx, "TRUNCATE outbox_messages, outbox_events CASCADE"); err != nil {
		return nil, err
	}
	rc.reset()
	if _, err := l.enqueue("order.placed", n, data); err != nil {
		return nil, err
	}
	l.p.Step("two outbox relays (two River clients): the claim moves rows to claimed in one statement, FOR UPDATE SKIP LOCKED")
	cfg := labRelayConfig()
	cfg.BatchSize = 50
	ta, tb := &countingTransport{Transport: httpTransport()}, &countingTransport{Transport: httpTransport()}
	start = time.Now()
	for _, t := range []relay.Transport{ta, tb} {
		if _, err := l.startRelay(cfg, t); err != nil {
			return nil, err
		}
	}
	err = l.waitFor(time.Minute, "every message delivered", func() (bool, string, error) {
		s, err := l.stats()
		d, _, _ := rc.counts()
		return s.Delivered == int64(n), fmt.Sprintf("%s · %d webhooks received", countText(s.Delivered, int64(n), "delivered"), d), err
	})
	if err != nil {
		return nil, err
	}
	claimTime := time.Since(start)
	d, u, _ = rc.counts()
	r.Section("with the claim: UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)")
	r.Count("claim.messages", "messages", int64(n), "")
	r.Count("claim.received", "webhooks received", d, "")
	r.Count("claim.unique", "distinct messages received", u, "")
	r.Count("claim.duplicates", "duplicates", d-u, "each row was claimed by exactly one relay")
	r.Text("claim.split", "sent by relay A / relay B", fmt.Sprintf("%d / %d", ta.sent.Load(), tb.sent.Load()), "")
	r.Duration("claim.time", "time", claimTime, "")
	r.Verdict("Without a claim, a second relay doubles the traffic instead of sharing it: %d duplicates.", r.Counts["naive.duplicates"])
	r.Verdict("With the claim, the relays partition the rows: %d duplicates.", d-u)
	if r.Counts["naive.duplicates"] == 0 || d != u || u != int64(n) {
		return r, fmt.Errorf("%w: lab 4 expects duplicates without the claim and none with it", errInvariant)
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
	r.Count("claimed", "claimed by the relay that died", claimed, "as many as its requests in flight: no other relay touches them")
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

func lab8(l *lab) (*Report, error) {
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
	r := newReport("Lab 8: head-of-line blocking")
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
		return r, fmt.Errorf("%w: lab 8 expects the single queue to fall behind and the outbox relay not to", errInvariant)
	}
	return r, nil
}
