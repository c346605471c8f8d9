package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/proctest"
)

// The binary as deployed: it relays until SIGTERM, then stops the relay
// and exits 0, saying so last. Everything else about the worker is tested
// in-process, in internal/relayworker.
func TestStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, "github.com/outboxkit/orders/cmd/worker")
	addr := proctest.FreeAddr(t)
	proctest.RequireStopsOnSIGTERM(t, bin, map[string]string{"DATABASE_URL": dbtest.URL(t), "WORKER_ADDR": addr, "LOG_FORMAT": "json"},
		func() bool { return proctest.Ready(addr) }, 15*time.Second, `"msg":"relay stopped"`)
}

// A second SIGTERM ends the worker at once: the first starts a graceful
// stop, which waits up to WORKER_SHUTDOWN_GRACE for requests in flight
// (here one to a receiver that never answers), and an operator who cannot
// wait sends another.
func TestASecondSignalEndsItAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	requested, release := make(chan struct{}, 1), make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case requested <- struct{}{}:
		default:
		}
		// Until the test ends: the server notices a client gone only once
		// the body is read, and this handler reads nothing.
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) }) // runs first

	bin := proctest.Build(t, "github.com/outboxkit/orders/cmd/worker")
	addr := proctest.FreeAddr(t)
	dbURL := dbtest.URL(t)
	p := proctest.Start(t, bin, map[string]string{"DATABASE_URL": dbURL, "WORKER_ADDR": addr,
		"LOG_FORMAT": "json", "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	cmd, out, exited := p.Cmd, p.Out, p.Exited
	require.Eventually(t, func() bool { return proctest.Ready(addr) }, 60*time.Second, 20*time.Millisecond, "the worker becomes ready")

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `
		WITH ep AS (
			INSERT INTO webhook_endpoints (url, secret, event_types) VALUES ($1, 'whsec_AAAA', '{order.placed}') RETURNING id
		), ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7_at(t.at), 'order.placed', '{}', t.at FROM (SELECT now() AS at) t RETURNING id, type, created_at
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, ep.id, ev.created_at, ev.created_at FROM ev, ep`, hang.URL+"/hook")
	require.NoError(t, err)
	select {
	case <-requested:
	case <-time.After(30 * time.Second):
		t.Fatalf("the message was never sent; output:\n%s", out.String())
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool {
		res, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "the first signal starts the graceful stop: the listener closes")
	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.Error(t, err, "ended by the signal, not a graceful exit")
		require.Less(t, time.Since(start), 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10s after the second SIGTERM (the grace is 15s); output:\n%s", out.String())
	}
}
