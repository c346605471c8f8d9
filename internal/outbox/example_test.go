package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/dbtest"
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
