package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxkit/orders/internal/consumer"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/webhook"
)

// Labs 1 to 3: the two dual writes, then the outbox under the same failures.
// The downstream system in all three is the reference consumer
// (internal/consumer): it verifies each webhook and applies it exactly once
// to a ledger, in the lab's database, so the report can compare what was
// announced with what exists.

// creditHolds installs the failing commit of labs 1 and 3: a deferred
// constraint trigger, the kind of rule (a credit limit, a uniqueness across
// tables) that PostgreSQL checks at COMMIT, refuses the orders of the held
// customers. The transaction does everything right until its last step.
func (l *lab) creditHolds(held map[int]bool) error {
	_, err := l.pool.Exec(l.ctx, `
CREATE TABLE workshop_credit_holds (customer_id text PRIMARY KEY);
CREATE FUNCTION workshop_credit_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM workshop_credit_holds WHERE customer_id = NEW.customer_id) THEN
    RAISE EXCEPTION 'credit check failed at commit for %', NEW.customer_id;
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER workshop_credit_check AFTER INSERT ON orders
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION workshop_credit_check();`)
	if err != nil {
		return fmt.Errorf("installing the credit check: %w", err)
	}
	for i := range held {
		if _, err := l.pool.Exec(l.ctx, "INSERT INTO workshop_credit_holds VALUES ($1)", customer(i)); err != nil {
			return err
		}
	}
	return nil
}

// startConsumer runs the reference consumer behind srv, verifying with secret.
func (l *lab) startConsumer(srv *server, secret string) (*consumer.Consumer, error) {
	if err := consumer.Migrate(l.ctx, l.pool, discardLogger()); err != nil {
		return nil, err
	}
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		return nil, err
	}
	c := consumer.New(l.pool, v, discardLogger())
	srv.Handle(c)
	return c, nil
}

// tally compares what exists (orders) with what the consumer applied.
type tally struct {
	orders, announced, phantom, lost, once, more int64
}

func (l *lab) tally() (tally, error) {
	var t tally
	err := l.pool.QueryRow(l.ctx, `
SELECT
  (SELECT count(*) FROM orders),
  (SELECT count(DISTINCT order_id) FROM consumer_ledger),
  (SELECT count(DISTINCT c.order_id) FROM consumer_ledger c WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = c.order_id)),
  (SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM consumer_ledger c WHERE c.order_id = o.id)),
  (SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM consumer_ledger c WHERE c.order_id = o.id) = 1),
  (SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM consumer_ledger c WHERE c.order_id = o.id) > 1)`).
		Scan(&t.orders, &t.announced, &t.phantom, &t.lost, &t.once, &t.more)
	if err != nil {
		return t, fmt.Errorf("comparing orders with the consumer's ledger: %w", err)
	}
	return t, nil
}

func lab1(l *lab) (*Report, error) {
	n := l.size(200)
	held := l.pick(n, 0.2)
	if err := l.creditHolds(held); err != nil {
		return nil, err
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		return nil, err
	}
	srv, err := l.serve(nil)
	if err != nil {
		return nil, err
	}
	if _, err := l.startConsumer(srv, secret); err != nil {
		return nil, err
	}
	pub, err := newPublisher(srv.URL, secret)
	if err != nil {
		return nil, err
	}

	l.p.Step("placing %d orders: BEGIN, insert, publish the webhook, COMMIT (a credit check at COMMIT refuses %d)", n, len(held))
	var sent, refused int64
	for i := range n {
		published, err := publishThenCommit(l.ctx, l.pool, pub, newOrder(i))
		if published {
			sent++
		}
		switch {
		case err != nil && published && strings.Contains(err.Error(), "credit check"):
			refused++
		case err != nil:
			return nil, err
		}
		l.p.Count(int64(i+1), int64(n), "orders")
	}
	t, err := l.tally()
	if err != nil {
		return nil, err
	}

	r := newReport("Lab 1: publish, then commit")
	r.Count("attempted", "orders attempted", int64(n), "")
	r.Count("sent", "webhooks sent", sent, "each before its COMMIT")
	r.Count("refused", "commits refused", refused, "after the webhook had gone out")
	r.Count("orders", "orders in the database", t.orders, "")
	r.Count("announced", "orders the consumer applied", t.announced, "")
	r.Count("phantom", "phantom events", t.phantom, "announced, but the order does not exist")
	r.Count("lost", "lost events", t.lost, "")
	r.Verdict("%d of %d announcements were about orders that never existed, and", t.phantom, t.announced)
	r.Verdict("the consumer has already acted on them. Nothing can take a webhook back.")
	if t.phantom == 0 {
		return r, fmt.Errorf("%w: no phantom events", errInvariant)
	}
	return r, nil
}

// writers runs writer children until orders 0..n-1 are all attempted,
// restarting each time one is killed, as a supervisor restarts a crashed
// process.
type writerResult struct{ committed, refused, published, killed int64 }

func (l *lab) writers(spec writerSpec, n int) (writerResult, error) {
	var res writerResult
	for start := 0; start < n; {
		spec.Start, spec.End = start, n
		last := start - 1
		killed, err := l.spawn("writer", spec, func(line string) {
			for prefix, counter := range map[string]*int64{"committed ": &res.committed, "failed ": &res.refused, "published ": &res.published} {
				if i, ok := atoiSuffix(line, prefix); ok {
					*counter++
					last = max(last, i)
				}
			}
			l.p.Status("%s · process killed %d times", countText(int64(last+1), int64(n), "orders"), res.killed)
		})
		if err != nil {
			return res, err
		}
		if killed {
			res.killed++
		}
		if last < start {
			return res, fmt.Errorf("the writer process made no progress")
		}
		start = last + 1
	}
	return res, nil
}

func lab2(l *lab) (*Report, error) {
	n := l.size(200)
	dies := l.pick(n, 0.1)
	secret, err := webhook.NewSecret()
	if err != nil {
		return nil, err
	}
	srv, err := l.serve(nil)
	if err != nil {
		return nil, err
	}
	if _, err := l.startConsumer(srv, secret); err != nil {
		return nil, err
	}
	l.p.Step("placing %d orders in a child process: COMMIT, then publish; it is SIGKILLed between the two %d times (and restarted)", n, len(dies))
	w, err := l.writers(writerSpec{DatabaseURL: l.url, Design: "commit-then-publish", ReceiverURL: srv.URL, Secret: secret,
		Die: keys(dies)}, n)
	if err != nil {
		return nil, err
	}
	t, err := l.tally()
	if err != nil {
		return nil, err
	}
	r := newReport("Lab 2: commit, then publish")
	r.Count("attempted", "orders attempted", int64(n), "")
	r.Count("orders", "orders committed", t.orders, "")
	r.Count("killed", "process killed", w.killed, "between COMMIT and publish (SIGKILL)")
	r.Count("sent", "webhooks sent", w.published, "")
	r.Count("announced", "orders the consumer applied", t.announced, "")
	r.Count("lost", "lost events", t.lost, "the order exists; nobody was told")
	r.Count("phantom", "phantom events", t.phantom, "")
	r.Verdict("%d orders exist that no downstream system will ever hear about. Nothing failed", t.lost)
	r.Verdict("from the process's point of view, so nothing was logged and nothing retries.")
	if t.lost == 0 {
		return r, fmt.Errorf("%w: no lost events", errInvariant)
	}
	return r, nil
}

func lab3(l *lab) (*Report, error) {
	n := l.size(200)
	held := l.pick(n, 0.2)
	dies := map[int]bool{}
	for i := range l.pick(n, 0.1) {
		if !held[i] {
			dies[i] = true
		}
	}
	if len(dies) == 0 {
		for i := range n {
			if !held[i] {
				dies[i] = true
				break
			}
		}
	}
	if err := l.creditHolds(held); err != nil {
		return nil, err
	}
	srv, err := l.serve(nil)
	if err != nil {
		return nil, err
	}
	ep, err := l.endpoint(srv.URL, "order.placed")
	if err != nil {
		return nil, err
	}
	cons, err := l.startConsumer(srv, ep.Secret)
	if err != nil {
		return nil, err
	}
	// Count every request the consumer answers, whatever the answer.
	var requests atomic.Int64
	srv.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cons.ServeHTTP(w, r)
		requests.Add(1)
	}))

	l.p.Step("placing %d orders with the real service (order + outbox row, one transaction), with lab 1's failing COMMITs and lab 2's kills", n)
	w, err := l.writers(writerSpec{DatabaseURL: l.url, Design: "outbox", Die: keys(dies)}, n)
	if err != nil {
		return nil, err
	}

	cfg := labRelayConfig()
	committed, err := l.count("SELECT count(*) FROM outbox_messages")
	if err != nil {
		return nil, err
	}
	after := 1 + l.rng.Int64N(max(1, committed/4))
	l.p.Step("a relay process delivers, and is SIGKILLed after %d webhooks went out, before recording them", after)
	var reported int64
	// The relay that dies sends one webhook at a time, so "sent before the
	// kill" is exact: each was answered, and applied, by the consumer.
	crashCfg := cfg
	crashCfg.DestinationConcurrency = 1
	dyingURL, err := url.Parse(l.url)
	if err != nil {
		return nil, err
	}
	q := dyingURL.Query()
	q.Set("application_name", dyingRelay)
	dyingURL.RawQuery = q.Encode()
	killed, err := l.spawn("relay", relaySpec{DatabaseURL: dyingURL.String(), Config: crashCfg, DieAfterSends: after}, func(line string) {
		if strings.HasPrefix(line, "sent ") {
			reported++
			l.p.Count(reported, after, "webhooks sent before the kill")
		}
	})
	if err != nil {
		return nil, err
	}
	if !killed {
		return nil, fmt.Errorf("the relay process exited without being killed")
	}
	// What the consumer got from the dead relay (once the requests it was
	// answering when the relay died are done), and what the relay recorded.
	sentBeforeKill := requests.Load()
	// A statement the relay sent just before it died still runs to its end
	// on the server, and may record an outcome: what it recorded is read
	// once its sessions are gone.
	if err := l.waitSessionsGone(dyingRelay); err != nil {
		return nil, err
	}
	recorded, err := l.count("SELECT count(*) FROM outbox_messages WHERE status = 'delivered'")
	if err != nil {
		return nil, err
	}
	heldClaims, err := l.count("SELECT count(*) FROM outbox_messages WHERE status = 'claimed'")
	if err != nil {
		return nil, err
	}

	l.p.Step("starting a healthy relay: once the dead relay's heartbeat is %s old it is declared dead, and what it held is delivered with the rest",
		seconds(relay.DefaultConfig().RelayTimeout))
	if _, err := l.startRelay(cfg, nil); err != nil {
		return nil, err
	}
	start := time.Now()
	err = l.waitFor(time.Minute, "every message delivered", func() (bool, string, error) {
		s, err := l.stats()
		if err != nil {
			return false, "", err
		}
		total := s.Pending + s.Claimed + s.Delivered + s.Failed
		return s.Pending+s.Claimed == 0, fmt.Sprintf("%s · %d still held by the dead relay · %s",
			countText(s.Delivered, total, "delivered"), s.Claimed, seconds(time.Since(start))), nil
	})
	if err != nil {
		return nil, err
	}
	t, err := l.tally()
	if err != nil {
		return nil, err
	}
	cs, err := cons.Stats(l.ctx)
	if err != nil {
		return nil, err
	}

	r := newReport("Lab 3: the outbox")
	r.Section("writing: the orders service, order and outbox row in one transaction")
	r.Count("attempted", "orders attempted", int64(n), "")
	r.Count("refused", "commits refused", w.refused, "lab 1's failing COMMIT: the outbox row rolled back too")
	r.Count("killed", "writer killed after COMMIT", w.killed, "lab 2's crash: the outbox row is already committed")
	r.Count("orders", "orders committed", t.orders, "")
	r.Section("relaying: the outbox relay, killed between send and mark")
	r.Count("relay_killed", "relay process killed", 1, "after sending, before recording (SIGKILL)")
	r.Count("sent_by_dead", "webhooks it sent", sentBeforeKill, "the consumer applied each one")
	r.Count("recorded_by_dead", "of which it recorded", recorded, "marked delivered before the kill; the rest were not")
	r.Count("held_by_dead", "messages it held claimed", heldClaims, "released when the dead relay's heartbeat is 5 s old")
	r.Count("received", "webhooks received in all", requests.Load(), "")
	r.Count("duplicates", "duplicates", cs.Duplicates, "same webhook-id again; the consumer's inbox skipped them")
	r.Section("outcome")
	r.Count("phantom", "phantom events", t.phantom, "")
	r.Count("lost", "lost events", t.lost, "")
	r.OutOf("once", "applied exactly once", t.once, t.orders, "orders")
	r.Count("more", "applied more than once", t.more, "")
	r.Verdict("Every committed order was announced and applied once; no refused order was announced.")
	r.Verdict("Delivery was at-least-once (duplicates: %d); the consumer's dedup on webhook-id made it exactly-once.", cs.Duplicates)
	if t.phantom != 0 || t.lost != 0 || t.once != t.orders || t.more != 0 || cs.Duplicates == 0 || cs.Duplicates < sentBeforeKill-recorded {
		return r, fmt.Errorf("%w: lab 3's invariants do not hold (consumer %+v, sent %d, recorded %d)", errInvariant, cs, sentBeforeKill, recorded)
	}
	return r, nil
}

func keys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

var _ http.Handler = (*consumer.Consumer)(nil)

// dyingRelay is the application_name of the relay lab 3 kills.
const dyingRelay = "workshop-dying-relay"

// waitSessionsGone waits until no session of the lab's database carries
// application name app.
func (l *lab) waitSessionsGone(app string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := l.count(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, app)
		if err != nil || n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sessions of %s still open after 30 s", n, app)
		}
		select {
		case <-l.ctx.Done():
			return l.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
