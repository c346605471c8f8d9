package relay_test

import (
	"context"
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
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
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
	if _, err := admin.New(pool, guard, logger).CreateEndpoint(ctx, receiver.URL, []string{"order.placed"}); err != nil {
		panic(err)
	}

	transport := &relay.HTTPTransport{Client: guard.Client()}
	r, err := relay.New(pool, relay.DefaultConfig(), transport, logger, nil)
	if err != nil {
		panic(err)
	}
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second) // the grace period
		defer cancel()
		_ = r.Stop(stopCtx)
	}()

	var event uuid.UUID
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		event, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: map[string]string{"id": "o-1"}})
		return err
	})
	fmt.Println(<-received == event.String())
	// Output: true
}
