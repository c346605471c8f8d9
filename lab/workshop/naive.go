package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/webhook"
)

// This file holds the designs the outbox replaces, written plainly so a
// learner can read them: the dual writes (labs 1 and 2), a consumer without
// an inbox (lab 3), the relays without a claim, with a lock held while
// sending, without per-key order (labs 4 and 7) or without per-destination
// isolation (lab 9), and a consumer that assumes commit order (lab 7).

// customer names order i's customer; a credit hold on it fails the commit.
func customer(i int) string { return fmt.Sprintf("customer-%04d", i) }

func newOrder(i int) orders.Order {
	return orders.Order{ID: uuid.New(), CustomerID: customer(i), Status: orders.StatusPlaced, TotalCents: 1000,
		Lines: []orders.Line{{SKU: "A-1", Quantity: 2, UnitPriceCents: 500}}, CreatedAt: time.Now().UTC()}
}

// insertOrder writes an order and its lines in tx, the way a service without
// an outbox would.
func insertOrder(ctx context.Context, tx pgx.Tx, o orders.Order) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer_id, status, total_cents, created_at)
		VALUES ($1, $2, 'placed', $3, $4)`, o.ID, o.CustomerID, o.TotalCents, o.CreatedAt); err != nil {
		return fmt.Errorf("inserting order: %w", err)
	}
	for i, line := range o.Lines {
		if _, err := tx.Exec(ctx, `INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
			VALUES ($1, $2, $3, $4, $5)`, o.ID, i+1, line.SKU, line.Quantity, line.UnitPriceCents); err != nil {
			return fmt.Errorf("inserting order line: %w", err)
		}
	}
	return nil
}

// publisher sends order.placed straight to the receiver, as a dual write
// does: a signed Standard Webhooks request, with a fresh id each time (there
// is no outbox row whose id could be reused).
type publisher struct {
	url    string
	signer *webhook.Signer
	client *http.Client
}

func newPublisher(url, secret string) (*publisher, error) {
	s, err := webhook.NewSigner(secret)
	if err != nil {
		return nil, err
	}
	return &publisher{url: url, signer: s, client: &http.Client{Timeout: 5 * time.Second}}, nil
}

func (p *publisher) publish(ctx context.Context, o orders.Order) error {
	id := uuid.New()
	data, err := json.Marshal(o)
	if err != nil {
		return err
	}
	// There is no outbox: the event is its own and only delivery.
	now := time.Now()
	body := admin.Message{ID: id, EventID: id, Type: orders.EventPlaced, CreatedAt: now, EventCreatedAt: now, Payload: data}.Body()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	p.signer.SetHeaders(req.Header, id.String(), time.Now(), body)
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("publishing: receiver answered %s", resp.Status)
	}
	return nil
}

// noInboxConsumer is lab 3's consumer without an inbox: it verifies each
// webhook and appends it to a ledger of its own, as the reference consumer
// does, but remembers no webhook-id, so a webhook sent again is applied
// again.
type noInboxConsumer struct {
	pool     *pgxpool.Pool
	verifier *webhook.Verifier
}

// noInboxLedger is its ledger: one row per webhook it applied.
const noInboxLedger = `CREATE TABLE workshop_ledger_no_inbox (
	webhook_id text NOT NULL,
	order_id   uuid NOT NULL,
	event_type text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now())`

func (c *noInboxConsumer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || c.verifier.Verify(r.Header, body) != nil {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var env struct {
		Type string `json:"type"`
		Data struct {
			ID uuid.UUID `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if _, err := c.pool.Exec(r.Context(), `INSERT INTO workshop_ledger_no_inbox (webhook_id, order_id, event_type) VALUES ($1, $2, $3)`,
		r.Header.Get(webhook.HeaderID), env.Data.ID, env.Type); err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// statusConsumer is lab 7's consumer that assumes commit order: it keeps
// each order's status as the last webhook it received says, as if webhooks
// came in the order their events happened.
type statusConsumer struct{ pool *pgxpool.Pool }

// statusTable is its state: each order's status, as last told.
const statusTable = `CREATE TABLE workshop_order_status (order_id uuid PRIMARY KEY, status text NOT NULL)`

func (c *statusConsumer) apply(ctx context.Context, order uuid.UUID, status string) error {
	_, err := c.pool.Exec(ctx, `INSERT INTO workshop_order_status (order_id, status) VALUES ($1, $2)
		ON CONFLICT (order_id) DO UPDATE SET status = excluded.status`, order, status)
	return err
}

// publishThenCommit is design 1: announce, then commit. When the commit
// fails, the announcement cannot be taken back.
func publishThenCommit(ctx context.Context, pool *pgxpool.Pool, pub *publisher, o orders.Order) (published bool, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := insertOrder(ctx, tx, o); err != nil {
		return false, err
	}
	if err := pub.publish(ctx, o); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// writerSpec tells a writer child which orders to place and where it dies.
type writerSpec struct {
	DatabaseURL string
	// Design is "commit-then-publish" (lab 2) or "outbox" (lab 3).
	Design      string
	ReceiverURL string
	Secret      string
	Start, End  int
	// Die lists the orders right after whose commit the process is killed.
	Die []int
}

// runWriterChild places orders Start..End-1 and prints, for each,
// "committed i", "failed i" (the commit was refused) or "published i". It
// SIGKILLs itself right after committing an order listed in Die: between
// the commit and the publish, where a real crash can land.
func runWriterChild(ctx context.Context, raw []byte) error {
	var spec writerSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, spec.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var pub *publisher
	if spec.Design == "commit-then-publish" {
		if pub, err = newPublisher(spec.ReceiverURL, spec.Secret); err != nil {
			return err
		}
	}
	svc := orders.NewService(pool, discardLogger())
	say := func(what string, i int) { fmt.Fprintf(os.Stdout, "%s %d\n", what, i) }
	for i := spec.Start; i < spec.End; i++ {
		var o orders.Order
		var err error
		switch spec.Design {
		case "commit-then-publish":
			o = newOrder(i)
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return insertOrder(ctx, tx, o) })
		case "outbox":
			// The real service: the order and its outbox row in one transaction.
			_, _, err = svc.Place(ctx, orders.PlaceRequest{CustomerID: customer(i),
				Lines: []orders.Line{{SKU: "A-1", Quantity: 2, UnitPriceCents: 500}}})
		default:
			return fmt.Errorf("unknown design %q", spec.Design)
		}
		if err != nil {
			say("failed", i)
			continue
		}
		say("committed", i)
		if slices.Contains(spec.Die, i) {
			die()
		}
		if pub != nil {
			if err := pub.publish(ctx, o); err != nil {
				return err
			}
			say("published", i)
		}
	}
	return nil
}

// relaySpec configures a relay child: the real outbox relay, which kills
// itself after DieAfterSends webhooks went out (before their outcome is
// recorded), or, when DieAfterSends is 0, after claiming and before its
// first request.
type relaySpec struct {
	DatabaseURL   string
	Config        relay.Config
	DieAfterSends int64
}

type dyingTransport struct {
	relay.Transport
	after int64
	sent  atomic.Int64
}

func (t *dyingTransport) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	if t.after == 0 {
		fmt.Fprintln(os.Stdout, "claimed")
		die()
	}
	res := t.Transport.Deliver(ctx, d)
	if res.Err == nil && res.StatusCode/100 == 2 {
		fmt.Fprintln(os.Stdout, "sent "+d.MessageID.String())
		if t.sent.Add(1) >= t.after {
			die() // the webhook went out; its outcome is never recorded
		}
	}
	return res
}

func runRelayChild(ctx context.Context, raw []byte) error {
	var spec relaySpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, spec.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := runRelay(ctx, pool, spec.Config, &dyingTransport{Transport: httpTransport(), after: spec.DieAfterSends}, discardLogger()); err != nil {
		return err
	}
	time.Sleep(time.Minute) // the transport kills the process long before this
	return fmt.Errorf("relay child: never died")
}

// pendingRow is what the naive relays read: a message (one delivery of an
// event to one endpoint), with its event and its endpoint.
type pendingRow struct {
	id, eventID      uuid.UUID
	typ, url, secret string
	payload          []byte
	eventCreatedAt   time.Time
}

// naiveSelect is the poll of a relay without a claim, and of a relay with a
// single queue: the oldest due pending rows, whatever their destination,
// each with its event's id, payload and time.
const naiveSelect = `
SELECT m.id, m.event_id, m.type, e.url, e.secret, ev.payload, ev.created_at
FROM outbox_messages m
JOIN outbox_events ev ON ev.id = m.event_id
JOIN webhook_endpoints e ON e.id = m.destination
WHERE m.status = 'pending' AND m.next_attempt_at <= now()
ORDER BY m.next_attempt_at, m.id
LIMIT $1`

func readPending(ctx context.Context, pool *pgxpool.Pool, limit int) ([]pendingRow, error) {
	rows, err := pool.Query(ctx, naiveSelect, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanPending)
}

func scanPending(r pgx.CollectableRow) (pendingRow, error) {
	var p pendingRow
	err := r.Scan(&p.id, &p.eventID, &p.typ, &p.url, &p.secret, &p.payload, &p.eventCreatedAt)
	return p, err
}

// send delivers one row as the real relay's transport would: webhook-id and
// the body's id are the event's.
func send(ctx context.Context, t relay.Transport, p pendingRow, timeout time.Duration) relay.Result {
	body := admin.Message{ID: p.id, EventID: p.eventID, Type: p.typ, EventCreatedAt: p.eventCreatedAt, Payload: p.payload}.Body()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return t.Deliver(ctx, relay.Delivery{EventID: p.eventID, MessageID: p.id, Type: p.typ, URL: p.url, Secret: p.secret, Body: body})
}

// naiveRelayNoClaim is lab 4's relay without a claim: SELECT the pending
// rows, send each, then UPDATE it to delivered. Two of these read the same
// rows before either marks them.
func naiveRelayNoClaim(ctx context.Context, pool *pgxpool.Pool, t relay.Transport, sent *atomic.Int64) error {
	for {
		rows, err := readPending(ctx, pool, 50)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		for _, p := range rows {
			if res := send(ctx, t, p, 5*time.Second); res.Err != nil || res.StatusCode/100 != 2 {
				continue
			}
			sent.Add(1)
			if _, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(), attempts = attempts + 1
				WHERE id = $1`, p.id); err != nil {
				return err
			}
		}
	}
}

// lockingRelay is a relay that holds a lock on what it sends: in one
// transaction it SELECTs due rows FOR UPDATE (lab 4 tries it with SKIP
// LOCKED and without), sends them, marks each delivered, or due again
// after retryAfter when it failed, and commits. Its locks keep every other
// relay off its rows until the commit; without SKIP LOCKED the others wait
// for them. Lab 7 runs several of them, one row at a time, as a relay that
// delivers in parallel and retries, with no per-key order.
type lockingRelay struct {
	pool       *pgxpool.Pool
	transport  relay.Transport
	skipLocked bool
	batch      int
	retryAfter time.Duration
	sent       atomic.Int64 // answered 2xx
}

// run delivers until nothing is pending.
func (r *lockingRelay) run(ctx context.Context) error {
	lock := " FOR UPDATE OF m"
	if r.skipLocked {
		lock += " SKIP LOCKED"
	}
	for {
		var n int
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, naiveSelect+lock, r.batch)
			if err != nil {
				return err
			}
			batch, err := pgx.CollectRows(rows, scanPending)
			if err != nil {
				return err
			}
			n = len(batch)
			for _, p := range batch {
				res := send(ctx, r.transport, p, 5*time.Second)
				if res.Err == nil && res.StatusCode/100 == 2 {
					r.sent.Add(1)
					_, err = tx.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(), attempts = attempts + 1
						WHERE id = $1`, p.id)
				} else {
					_, err = tx.Exec(ctx, `UPDATE outbox_messages SET attempts = attempts + 1, last_error = 'refused',
						next_attempt_at = now() + make_interval(secs => $2) WHERE id = $1`, p.id, r.retryAfter.Seconds())
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		// Nothing due that another relay has not locked: done once nothing
		// is pending, else look again when a retry may be due.
		var pending bool
		if err := r.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE status = 'pending')").Scan(&pending); err != nil {
			return err
		}
		if !pending {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// naiveRelaySingleQueue is lab 9's relay without per-destination isolation:
// one queue, oldest first, one delivery at a time. A failure backs the row
// off; but every row for a receiver that hangs costs a full timeout first,
// and everything behind it waits.
func naiveRelaySingleQueue(ctx context.Context, pool *pgxpool.Pool, t relay.Transport, timeout, backoff time.Duration) error {
	for ctx.Err() == nil {
		rows, err := readPending(ctx, pool, 10)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		for _, p := range rows {
			res := send(ctx, t, p, timeout)
			if ctx.Err() != nil {
				return nil
			}
			if res.Err == nil && res.StatusCode/100 == 2 {
				_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(), attempts = attempts + 1 WHERE id = $1`, p.id)
			} else {
				_, err = pool.Exec(ctx, `UPDATE outbox_messages SET attempts = attempts + 1, next_attempt_at = now() + make_interval(secs => $2), last_error = 'timeout' WHERE id = $1`,
					p.id, backoff.Seconds())
			}
			if err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
	return nil
}

func atoiSuffix(line, prefix string) (int, bool) {
	if len(line) <= len(prefix) || line[:len(prefix)] != prefix {
		return 0, false
	}
	n, err := strconv.Atoi(line[len(prefix):])
	return n, err == nil
}
