package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
)

// examplePool gives an example its own database on the test server.
func examplePool() (*pgxpool.Pool, func()) {
	ctx := context.Background()
	url, drop, err := dbtest.Create(ctx)
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('https://example.com/hooks', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', '{order.placed}')`)
	if err != nil {
		panic(err)
	}
	return pool, func() { pool.Close(); _ = drop() }
}

// Enqueue writes the event in the same transaction as the business change:
// if the transaction rolls back, so does the message.
func ExampleEnqueue() {
	pool, cleanup := examplePool()
	defer cleanup()
	ctx := context.Background()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... write the business rows with tx here ...
		event, err := outbox.Enqueue(ctx, tx, outbox.Event{
			Type: "order.placed",
			Data: map[string]any{"id": "o-1", "total_cents": 1000},
			// The events of one order reach each endpoint in commit order.
			OrderingKey: "o-1",
		})
		if err != nil {
			return err
		}
		// The event id is every delivery's webhook-id: time-ordered.
		fmt.Println("event id:", event.Version())
		return nil
	})
	if err != nil {
		fmt.Println("error:", err)
	}
	// Output: event id: VERSION_7
}

// Enqueue refuses to write outside a transaction: that would be the
// dual-write bug again.
func ExampleEnqueue_notInTransaction() {
	pool, cleanup := examplePool()
	defer cleanup()
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	_ = tx.Commit(ctx) // too early: the transaction is over

	_, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: 1})
	fmt.Println(errors.Is(err, outbox.ErrNotInTx))
	_, err = outbox.Enqueue(ctx, nil, outbox.Event{Type: "order.placed", Data: 1})
	fmt.Println(errors.Is(err, outbox.ErrNotInTx))
	// Output:
	// true
	// true
}

// Queue sends the event with the caller's own statements, in one round
// trip: the outbox adds a statement to the transaction, not a round trip.
func ExampleQueue() {
	pool, cleanup := examplePool()
	defer cleanup()
	ctx := context.Background()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var b pgx.Batch
		// ... queue the business statements on b here ...
		b.Queue("SELECT 1")
		queued, err := outbox.Queue(ctx, tx, &b, outbox.Event{
			Type: "order.placed", Data: map[string]any{"id": "o-1"}, OrderingKey: "o-1",
		})
		if err != nil {
			return err // the event is invalid: nothing was queued
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		fmt.Println("event id:", queued.ID().Version())
		return nil
	})
	if err != nil {
		fmt.Println("error:", err)
	}
	// Output: event id: VERSION_7
}

// A worker runs the relay: it starts River and the relay's dispatch and
// heartbeat, delivers until it is stopped, and on Stop lets the requests in
// flight finish (within the context's deadline), records them, and leaves
// nothing claimed. cmd/worker does this with its configuration from the
// environment.
func ExampleRelay() {
	ctx := context.Background()
	url, drop, err := dbtest.Create(ctx) // a migrated database of the example's own
	if err != nil {
		panic(err)
	}
	defer drop() //nolint:errcheck
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	logger := slog.New(slog.DiscardHandler)
	guard := netguard.Guard{AllowPrivate: true} // the receiver is on loopback, for the example

	received := make(chan string, 1)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received <- r.Header.Get("webhook-id")
	}))
	defer receiver.Close()
	// Endpoints are registered through the admin service (POST
	// /webhook-endpoints in the api), which checks the URL with the guard.
	if _, err := outbox.NewAdmin(pool, guard, logger).CreateEndpoint(ctx, receiver.URL, []string{"order.placed"}); err != nil {
		panic(err)
	}

	transport := &outbox.HTTPTransport{Client: guard.Client()}
	relay, err := outbox.NewRelay(pool, outbox.DefaultRelayConfig(), transport, logger, nil)
	if err != nil {
		panic(err)
	}
	if err := relay.Start(ctx); err != nil {
		panic(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second) // the grace period
		defer cancel()
		_ = relay.Stop(stopCtx)
	}()

	var event uuid.UUID
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		event, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: map[string]string{"id": "o-1"}})
		return err
	})
	fmt.Println(<-received == event.String())
	// Output: true
}

// A refusal says why twice: Reason for the person who sent the input (the
// admin API's problem detail), Error for a log, with the chain that
// wrapped it. Vetting a change needs no database.
func ExampleReason() {
	admin := outbox.NewAdmin(nil, netguard.Guard{}, slog.New(slog.DiscardHandler))
	bad := "ftp://1.1.1.1/hooks"
	err := admin.CheckEndpointChange(context.Background(), outbox.EndpointChange{URL: &bad})
	fmt.Println(errors.Is(err, outbox.ErrInvalidEndpoint), errors.Is(err, netguard.ErrInvalidURL))
	fmt.Println(outbox.Reason(err))
	fmt.Println(err)
	// Output:
	// true true
	// url: scheme "ftp" is not http or https
	// outbox: invalid webhook endpoint: checking webhook url: netguard: invalid webhook url: scheme "ftp" is not http or https
}
