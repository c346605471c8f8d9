package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/webhook"
)

// Lab 7: per-key order. Each order is placed, then cancelled: two events
// keyed by the order id. A receiver refuses the first attempt of some
// placements (409, a transient failure); delivered in parallel and retried
// without per-key order, their cancellations overtake them, and a consumer
// that keeps the last status it was told ends with the earlier state.

// orderEvent is what the lab's receivers read of an order event.
type orderEvent struct {
	Type string `json:"type"`
	Data struct {
		ID     uuid.UUID `json:"id"`
		Status string    `json:"status"`
	} `json:"data"`
}

// orderReceiver is lab 7's receiver: it refuses the first attempt of the
// placements of the flaky orders (409, then accepts them), always refuses
// the placements of the poison orders until fixed (422), and hands every
// other webhook to apply.
type orderReceiver struct {
	mu        sync.Mutex
	flaky     map[uuid.UUID]bool
	poison    map[uuid.UUID]bool
	fixed     bool
	seen      map[string]bool // webhook-ids refused once
	refused   int64
	applyFunc func(r *http.Request, ev orderEvent) int
}

func newOrderReceiver(apply func(r *http.Request, ev orderEvent) int) *orderReceiver {
	rc := &orderReceiver{applyFunc: apply}
	rc.reset()
	return rc
}

func (rc *orderReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var ev orderEvent
	if err != nil || json.Unmarshal(body, &ev) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	id := r.Header.Get(webhook.HeaderID)
	rc.mu.Lock()
	switch {
	case ev.Type == orders.EventPlaced && rc.poison[ev.Data.ID] && !rc.fixed:
		rc.mu.Unlock()
		w.WriteHeader(http.StatusUnprocessableEntity)
		return
	case ev.Type == orders.EventPlaced && rc.flaky[ev.Data.ID] && !rc.seen[id]:
		rc.seen[id] = true
		rc.refused++
		rc.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		return
	}
	apply := rc.applyFunc
	rc.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	w.WriteHeader(apply(r, ev))
}

// reset forgets everything but how to apply.
func (rc *orderReceiver) reset() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.flaky, rc.poison, rc.seen = map[uuid.UUID]bool{}, map[uuid.UUID]bool{}, map[string]bool{}
	rc.fixed, rc.refused = false, 0
}

// refusals counts the first attempts refused.
func (rc *orderReceiver) refusals() int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.refused
}

// placeAndCancel places n orders with the real service and cancels each
// right after: two events per order, keyed by its id.
func (l *lab) placeAndCancel(n int) ([]uuid.UUID, error) {
	svc := orders.NewService(l.pool, discardLogger())
	ids := make([]uuid.UUID, n)
	for i := range n {
		o, _, err := svc.Place(l.ctx, orders.PlaceRequest{CustomerID: customer(i),
			Lines: []orders.Line{{SKU: "A-1", Quantity: 1, UnitPriceCents: 500}}})
		if err != nil {
			return nil, err
		}
		if _, err := svc.Cancel(l.ctx, o.ID); err != nil {
			return nil, err
		}
		ids[i] = o.ID
	}
	return ids, nil
}

// parallelRelays runs k relays without per-key order to the end: each
// delivers one row at a time, oldest due first, skipping what the others
// locked, and a refused row is due again after retryAfter.
func (l *lab) parallelRelays(k int, retryAfter time.Duration) error {
	// A pool of their own, as relays in their own processes would have:
	// each holds a connection while it sends, and the receiver, in the
	// lab's pool, needs one to apply what it gets.
	cfg, err := pgxpool.ParseConfig(l.url)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(k + 1)
	pool, err := pgxpool.NewWithConfig(l.ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			lr := &lockingRelay{pool: pool, transport: httpTransport(), skipLocked: true, batch: 1, retryAfter: retryAfter}
			errs[i] = lr.run(l.ctx)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// wrongStatuses counts the orders whose status the status consumer holds
// is not theirs.
func (l *lab) wrongStatuses() (int64, error) {
	return l.count(`SELECT count(*) FROM orders o LEFT JOIN workshop_order_status s ON s.order_id = o.id
		WHERE s.status IS DISTINCT FROM o.status`)
}

// messageOf finds the delivery of typ for order id.
func (l *lab) messageOf(id uuid.UUID, typ string) (uuid.UUID, error) {
	var m uuid.UUID
	err := l.pool.QueryRow(l.ctx, `SELECT id FROM outbox_messages WHERE ordering_key = $1 AND type = $2`, id.String(), typ).Scan(&m)
	return m, err
}

func lab7(l *lab) (*Report, error) {
	n := l.size(50)
	const relays, retryAfter = 4, 200 * time.Millisecond
	if _, err := l.pool.Exec(l.ctx, statusTable); err != nil {
		return nil, fmt.Errorf("creating the status consumer's table: %w", err)
	}
	status := &statusConsumer{pool: l.pool}
	rc := newOrderReceiver(func(r *http.Request, ev orderEvent) int {
		if err := status.apply(r.Context(), ev.Data.ID, ev.Data.Status); err != nil {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	srv, err := l.serve(rc)
	if err != nil {
		return nil, err
	}
	// fresh starts a part: no orders, no outbox, one endpoint, at path, and
	// n new orders, whose placements the receiver refuses once (a fifth of
	// them) or always (poisoned of them, until fixed).
	fresh := func(path string, poisoned int) (ep admin.Endpoint, poison []uuid.UUID, err error) {
		if _, err := l.pool.Exec(l.ctx, `TRUNCATE outbox_messages, outbox_events, orders, workshop_order_status CASCADE;
			DELETE FROM webhook_endpoints`); err != nil {
			return ep, nil, err
		}
		rc.reset()
		if ep, err = l.endpoint(srv.URL+path, orders.EventPlaced, orders.EventCancelled); err != nil {
			return ep, nil, err
		}
		l.p.Step("placing %d orders, each cancelled right after: two events keyed by the order id, to %s", n, ep.URL)
		ids, err := l.placeAndCancel(n)
		if err != nil {
			return ep, nil, err
		}
		flaky := l.pick(n, 0.2)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for i := range flaky {
			rc.flaky[ids[i]] = true
		}
		for i := 0; len(poison) < poisoned && i < n; i++ {
			if !flaky[i] {
				rc.poison[ids[i]] = true
				poison = append(poison, ids[i])
			}
		}
		return ep, poison, nil
	}
	r := newReport("Lab 7: per-key order")

	// Without per-key order.
	if _, _, err := fresh("/status", 0); err != nil {
		return nil, err
	}
	l.p.Step("%d relays without per-key order: each delivers the oldest due webhook the others have not locked, and retries a refused one %s later",
		relays, seconds(retryAfter))
	if err := l.parallelRelays(relays, retryAfter); err != nil {
		return nil, err
	}
	wrong, err := l.wrongStatuses()
	if err != nil {
		return nil, err
	}
	r.Section(fmt.Sprintf("without per-key order: %d relays deliver in parallel, and retry a refused webhook %s later", relays, seconds(retryAfter)))
	r.Count("parallel.orders", "orders", int64(n), "each placed, then cancelled")
	r.Count("parallel.refused", "placements refused once", rc.refusals(), "409: the receiver's passing failures")
	r.Count("parallel.wrong", "orders the consumer has wrong", wrong, "cancelled, but it says placed: the placement came last")

	// With per-key order, and a failed message holding its key.
	_, poison, err := fresh("/status-ordered", 2)
	if err != nil {
		return nil, err
	}
	cfg := labRelayConfig()
	cfg.MaxAttempts = 3
	l.p.Step("the outbox relay, per-key order: an order's cancellation waits for its placement; 2 placements the receiver always refuses (422), attempt cap %d",
		cfg.MaxAttempts)
	stop, err := l.startRelay(cfg, nil)
	if err != nil {
		return nil, err
	}
	healthy := int64(2 * (n - len(poison)))
	err = l.waitFor(time.Minute, "the other orders delivered and the refused placements failed", func() (bool, string, error) {
		s, err := l.stats()
		return s.Delivered == healthy && s.Failed == int64(len(poison)), fmt.Sprintf("%s · %d failed · %d parked behind an earlier message of their key",
			countText(s.Delivered, healthy, "delivered"), s.Failed, s.Parked), err
	})
	if err != nil {
		return nil, err
	}
	wrong, err = l.count(`SELECT count(*) FROM orders o LEFT JOIN workshop_order_status s ON s.order_id = o.id
		WHERE s.status IS DISTINCT FROM o.status AND NOT o.id = ANY($1)`, poison)
	if err != nil {
		return nil, err
	}
	waited, err := l.count(`SELECT count(*) FROM outbox_messages WHERE type = $1 AND status = 'delivered' AND attempts > 1`, orders.EventPlaced)
	if err != nil {
		return nil, err
	}
	held, err := l.count(`SELECT count(*) FROM outbox_messages WHERE type = $1 AND status = 'pending' AND ordering_key = ANY($2)`,
		orders.EventCancelled, []string{poison[0].String(), poison[1].String()})
	if err != nil {
		return nil, err
	}
	r.Section("with per-key order: the outbox relay, each order's events keyed by its id")
	r.Count("ordered.orders", "orders", int64(n), "")
	r.Count("ordered.refused", "placements refused once", rc.refusals(), "")
	r.Count("ordered.waited", "cancellations that waited", waited, "behind their order's placement, until its retry was delivered")
	r.Count("ordered.wrong", "orders the consumer has wrong", wrong, "")

	// A person skips one failed placement and retries the other.
	adm := l.admin()
	failedA, err := l.messageOf(poison[0], orders.EventPlaced)
	if err != nil {
		return nil, err
	}
	failedB, err := l.messageOf(poison[1], orders.EventPlaced)
	if err != nil {
		return nil, err
	}
	l.p.Step("a person skips one failed placement; the receiver is fixed and the other is retried")
	if _, err := adm.Skip(l.ctx, failedA); err != nil {
		return nil, err
	}
	rc.mu.Lock()
	rc.fixed = true
	rc.mu.Unlock()
	if _, err := adm.Retry(l.ctx, failedB); err != nil {
		return nil, err
	}
	err = l.waitFor(30*time.Second, "the held cancellations delivered", func() (bool, string, error) {
		s, err := l.stats()
		return s.Pending+s.Claimed == 0, fmt.Sprintf("%d pending · %d delivered", s.Pending+s.Claimed, s.Delivered), err
	})
	if err != nil {
		return nil, err
	}
	stop()
	state := func(id uuid.UUID, typ string) (string, error) {
		m, err := l.messageOf(id, typ)
		if err != nil {
			return "", err
		}
		msg, err := adm.Message(l.ctx, m)
		return msg.Status, err
	}
	var states [4]string
	for i, c := range []struct {
		id  uuid.UUID
		typ string
	}{{poison[0], orders.EventPlaced}, {poison[0], orders.EventCancelled}, {poison[1], orders.EventPlaced}, {poison[1], orders.EventCancelled}} {
		if states[i], err = state(c.id, c.typ); err != nil {
			return nil, err
		}
	}
	allWrong, err := l.wrongStatuses()
	if err != nil {
		return nil, err
	}
	r.Section("a failed message holds its key")
	r.Count("held.failed", "placements failed", int64(len(poison)), fmt.Sprintf("422 at each of %d attempts: the receiver refuses them", cfg.MaxAttempts))
	r.Count("held.held", "cancellations held behind them", held, "pending: not sent while their placement stands failed")
	r.OutOf("held.others", "other orders delivered meanwhile", healthy/2, int64(n-len(poison)), "")
	r.Text("held.skipped", "cancellation behind a skipped one", states[1], "a person skipped the failed placement ("+states[0]+")")
	r.Text("held.retried", "cancellation behind a retried one", states[3], "after its placement ("+states[2]+"), retried once the receiver was fixed")
	r.Count("held.wrong", "orders the consumer has wrong", allWrong, "")

	// The receiver's own defence.
	ep, _, err := fresh("/ledger", 0)
	if err != nil {
		return nil, err
	}
	cons, err := l.newConsumer(ep.Secret)
	if err != nil {
		return nil, err
	}
	rc.mu.Lock()
	rc.applyFunc = func(r *http.Request, _ orderEvent) int {
		w := httptest.NewRecorder()
		cons.ServeHTTP(w, r)
		return w.Code
	}
	rc.mu.Unlock()
	l.p.Step("the reference consumer behind the %d relays without per-key order: it refuses an order.cancelled that comes before its order.placed (409)", relays)
	if err := l.parallelRelays(relays, retryAfter); err != nil {
		return nil, err
	}
	cs, err := cons.Stats(l.ctx)
	if err != nil {
		return nil, err
	}
	ledgerWrong, err := l.count(`SELECT count(*) FROM orders o WHERE NOT EXISTS (
		SELECT 1 FROM consumer_ledger p JOIN consumer_ledger c ON c.order_id = p.order_id AND c.id > p.id
		WHERE p.order_id = o.id AND p.event_type = $1 AND c.event_type = $2)`, orders.EventPlaced, orders.EventCancelled)
	if err != nil {
		return nil, err
	}
	r.Section(fmt.Sprintf("the receiver's own defence: the reference consumer, behind the %d relays without per-key order", relays))
	r.Count("defence.refused", "placements refused once", rc.refusals(), "")
	r.Count("defence.early", "cancellations it refused", cs.OutOfOrder, "409: order.cancelled before its order.placed; the relay retried it")
	r.Count("defence.wrong", "orders the ledger has wrong", ledgerWrong, "")

	r.Verdict("Delivered in parallel and retried, %d of %d orders ended wrong: an earlier event overwrote a later one.", r.Counts["parallel.wrong"], n)
	r.Verdict("Per key, an order's events arrive in the order they happened: %d wrong. A failed message holds", r.Counts["ordered.wrong"])
	r.Verdict("its key until a person skips or retries it. A receiver can defend itself too: it refuses what comes early.")
	c := r.Counts
	if c["parallel.wrong"] == 0 || c["ordered.wrong"] != 0 || c["held.wrong"] != 0 || c["defence.wrong"] != 0 ||
		c["ordered.waited"] != c["ordered.refused"] || c["held.held"] != int64(len(poison)) || c["defence.early"] == 0 ||
		states != [4]string{outbox.StatusDiscarded, outbox.StatusDelivered, outbox.StatusDelivered, outbox.StatusDelivered} {
		return r, fmt.Errorf("%w: lab 7's invariants do not hold (%v, %v)", errInvariant, c, states)
	}
	return r, nil
}
