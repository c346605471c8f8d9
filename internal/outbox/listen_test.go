package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// notifying returns a fixture on a fresh database, and a second pool on it
// whose connections notify relays at commit (NotifyRelays).
func notifying(t *testing.T) (fixture, *pgxpool.Pool) {
	t.Helper()
	url := dbtest.URL(t)
	pool := func(notify bool) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		if notify {
			outbox.NotifyRelays(cfg.ConnConfig)
		}
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	plain := pool(false)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return fixture{pool: plain, admin: admin.New(plain, netguard.Guard{AllowPrivate: true}, logger)}, pool(true)
}

// Enqueue notifies only on a connection set up by NotifyRelays, only when
// the event has a message, and names the destinations to wake.
func TestEnqueueNotifiesOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	f, notify := notifying(t)
	ctx := context.Background()
	a, b := newReceiver(t), newReceiver(t)
	epA := f.endpoint(t, a, "order.placed")
	epB := f.endpoint(t, b, "order.placed")

	listener, err := pgx.Connect(ctx, f.pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(ctx) })
	_, err = listener.Exec(ctx, "LISTEN outbox")
	require.NoError(t, err)
	next := func() (string, bool) {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			return "", false
		}
		return n.Payload, true
	}
	publish := func(pool *pgxpool.Pool, typ string) {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Data: 1})
			return err
		}))
	}

	publish(f.pool, "order.placed")
	_, got := next()
	require.False(t, got, "no notification without NotifyRelays")

	publish(notify, "order.placed")
	payload, got := next()
	require.True(t, got, "a notification at commit")
	require.ElementsMatch(t, []string{epA.ID.String(), epB.ID.String()}, strings.Split(payload, ","), "naming the destinations")

	publish(notify, "nobody.listens")
	_, got = next()
	require.False(t, got, "no message, no notification")
}

// With Listen, a relay delivers an event right after its commit, not at its
// next poll. The poll interval is set long to tell one from the other on a
// loaded machine (CI saw a 2.4 s delivery with a 3 s poll): an event that
// waited for a poll would take up to 20 s.
func TestListeningRelayDeliversAtCommit(t *testing.T) {
	t.Parallel()
	f, notify := notifying(t)
	ctx := context.Background()
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	rc := newReceiver(t)
	rc.respond = func(r *http.Request, _ int) int {
		mu.Lock()
		arrived[r.Header.Get("webhook-id")] = time.Now()
		mu.Unlock()
		return http.StatusNoContent
	}
	f.endpoint(t, rc, "order.placed")
	const poll = 20 * time.Second
	f.startRelay(t, relay.Config{PollInterval: poll, Listen: true}, nil)

	committed := map[string]time.Time{}
	for i := range 10 {
		var id uuid.UUID
		require.NoError(t, pgx.BeginFunc(ctx, notify, func(tx pgx.Tx) (err error) {
			id, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: i})
			return err
		}))
		committed[id.String()] = time.Now()
		eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := arrived[id.String()]
			return ok
		}, "delivered")
		// Spaced out, so commits land at different points of the deliver
		// job's loop: waiting on its results, on its poll, or claiming.
		time.Sleep(600 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	var slowest time.Duration
	for id, at := range committed {
		slowest = max(slowest, arrived[id].Sub(at))
	}
	t.Logf("slowest commit to delivery: %s (poll interval %s)", slowest, poll)
	require.Less(t, slowest, poll/4, "every event delivered at its commit, none waited for a poll")
}
