package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
	c, err := l.newConsumer(secret)
	if err != nil {
		return nil, err
	}
	srv.Handle(c)
	return c, nil
}

// newConsumer is the reference consumer, its tables in the lab's database,
// verifying with secret.
func (l *lab) newConsumer(secret string) (*consumer.Consumer, error) {
	if err := consumer.Migrate(l.ctx, l.pool, discardLogger()); err != nil {
		return nil, err
	}
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		return nil, err
	}
	return consumer.New(l.pool, v, discardLogger()), nil
}

// tally compares what exists (orders) with what a consumer applied.
type tally struct {
	orders, announced, phantom, lost, once, more int64
}

// tally reads the reference consumer's ledger.
func (l *lab) tally() (tally, error) { return l.tallyOf("consumer_ledger") }

// tallyOf reads the ledger in table, which holds an order_id per entry.
func (l *lab) tallyOf(table string) (tally, error) {
	var t tally
	err := l.pool.QueryRow(l.ctx, strings.ReplaceAll(`
SELECT
  (SELECT count(*) FROM orders),
  (SELECT count(DISTINCT order_id) FROM LEDGER),
  (SELECT count(DISTINCT c.order_id) FROM LEDGER c WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = c.order_id)),
  (SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM LEDGER c WHERE c.order_id = o.id)),
  (SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM LEDGER c WHERE c.order_id = o.id) = 1),
  (SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM LEDGER c WHERE c.order_id = o.id) > 1)`, "LEDGER", table)).
		Scan(&t.orders, &t.announced, &t.phantom, &t.lost, &t.once, &t.more)
	if err != nil {
		return t, fmt.Errorf("comparing orders with the ledger %s: %w", table, err)
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

// consumerWork is what each webhook costs lab 3's consumers, longer than
// the relay's poll interval (50 ms), between which it writes the outcomes
// of its requests: the relay that is killed has then recorded every
// webhook it sent but the last one or two, whatever the machine's speed.
const consumerWork = 60 * time.Millisecond

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
	if _, err := l.pool.Exec(l.ctx, noInboxLedger); err != nil {
		return nil, fmt.Errorf("creating the ledger without an inbox: %w", err)
	}
	verifier, err := webhook.NewVerifier(ep.Secret)
	if err != nil {
		return nil, err
	}
	// The same webhooks go to two consumers side by side: the reference
	// consumer, with its inbox, and one without. Every request is counted,
	// whatever the answer.
	noInbox := &noInboxConsumer{pool: l.pool, verifier: verifier}
	var requests atomic.Int64
	srv.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(consumerWork) // the consumers' own work on each webhook
		body, err := io.ReadAll(io.LimitReader(r.Body, consumer.MaxBody))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		status := http.StatusNoContent
		for _, h := range []http.Handler{cons, noInbox} {
			rec := httptest.NewRecorder()
			req := r.Clone(r.Context())
			req.Body = io.NopCloser(bytes.NewReader(body))
			h.ServeHTTP(rec, req)
			if rec.Code/100 != 2 {
				status = rec.Code
			}
		}
		requests.Add(1)
		w.WriteHeader(status)
	}))

	l.p.Step("placing %d orders with the real service (order + outbox row, one transaction), with lab 1's failing COMMITs and lab 2's kills", n)
	w, err := l.writers(writerSpec{DatabaseURL: l.url, Design: "outbox", Die: keys(dies)}, n)
	if err != nil {
		return nil, err
	}

	cfg := labRelayConfig()
	after := int64(max(1, n/10))
	l.p.Step("a relay process delivers, one webhook at a time, and is SIGKILLed after %d went out, before recording the last", after)
	var reported int64
	// The relay that dies sends one webhook at a time, so "sent before the
	// kill" is exact: each was answered, and applied, by the consumers.
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
	died := time.Now()
	// What the consumers got from the dead relay (once the requests they
	// were answering when it died are done), and what the relay recorded.
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

	timeout := relay.DefaultConfig().RelayTimeout
	l.p.Step("a healthy relay starts; the dead relay's deliver job holds the endpoint (its lease) until its heartbeat is %s old: nothing is sent until then",
		seconds(timeout))
	if _, err := l.startRelay(cfg, nil); err != nil {
		return nil, err
	}
	var silence time.Duration
	err = l.waitFor(time.Minute, "every message delivered", func() (bool, string, error) {
		s, err := l.stats()
		if err != nil {
			return false, "", err
		}
		total := s.Pending + s.Claimed + s.Delivered + s.Failed
		status := countText(s.Delivered, total, "delivered")
		if requests.Load() == sentBeforeKill {
			status += fmt.Sprintf(" · %d held by the dead relay, whose lease holds the endpoint: %s since the kill, the relay timeout is %s",
				s.Claimed, seconds(time.Since(died)), seconds(timeout))
		} else if silence == 0 {
			silence = time.Since(died)
		}
		return s.Pending+s.Claimed == 0, status, nil
	})
	if err != nil {
		return nil, err
	}
	with, err := l.tally()
	if err != nil {
		return nil, err
	}
	without, err := l.tallyOf("workshop_ledger_no_inbox")
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
	r.Count("orders", "orders committed", with.orders, "")
	r.Section("relaying: the outbox relay, killed between send and mark")
	r.Count("relay_killed", "relay process killed", 1, "after sending, before recording (SIGKILL)")
	r.Count("sent_by_dead", "webhooks it sent", sentBeforeKill, "each applied by both consumers")
	r.Count("recorded_by_dead", "of which it recorded", recorded, "marked delivered before the kill; the rest were not")
	r.Count("held_by_dead", "messages it held claimed", heldClaims, "released when the dead relay's heartbeat is 5 s old")
	r.Duration("silence", "nothing sent for", silence, "after the kill: the dead relay's job held the endpoint's lease")
	r.Count("received", "webhooks received in all", requests.Load(), "")
	r.Count("sent_again", "sent again", requests.Load()-with.orders, "sent, not recorded, so sent again: same webhook-id")
	r.Section("the consumer with an inbox: the webhook-id recorded in the transaction of the effect")
	r.Count("phantom", "phantom events", with.phantom, "")
	r.Count("lost", "lost events", with.lost, "")
	r.OutOf("once", "applied exactly once", with.once, with.orders, "orders")
	r.Count("more", "applied more than once", with.more, "")
	r.Count("duplicates", "duplicates skipped", cs.Duplicates, "the inbox had the webhook-id already")
	r.Section("the same webhooks, to a consumer without an inbox")
	r.OutOf("no_inbox.once", "applied exactly once", without.once, without.orders, "orders")
	r.Count("no_inbox.more", "applied more than once", without.more, "each webhook sent again was applied again")
	r.Verdict("Every committed order was announced, no refused one: delivery was at-least-once (%d sent again).", r.Counts["sent_again"])
	r.Verdict("The consumer with an inbox applied each order once; the one without applied %d of them twice.", without.more)
	if with.phantom != 0 || with.lost != 0 || with.once != with.orders || with.more != 0 || cs.Duplicates == 0 ||
		cs.Duplicates != r.Counts["sent_again"] || without.more != cs.Duplicates || without.lost != 0 {
		return r, fmt.Errorf("%w: lab 3's invariants do not hold (consumer %+v, sent %d, recorded %d, without an inbox %+v)",
			errInvariant, cs, sentBeforeKill, recorded, without)
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
