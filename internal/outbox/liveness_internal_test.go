package outbox

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
)

// A job's final writes retried while the pool is slow (here one that waits
// as long as it is let) do not hold the heartbeat: the relay keeps beating
// every second or so, well inside its timeout, so no other relay declares
// it dead and releases claims whose requests are in flight.
func TestASlowSettleRetryDoesNotHoldTheHeartbeat(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	r := startRelay(t, pool, nil)
	blocked := make(chan struct{}, 1)
	r.deferSettle(func(ctx context.Context) error {
		select {
		case blocked <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	})
	<-blocked
	// Over the next RelayTimeout and a half, the heartbeat is never older
	// than half the timeout (it beats every fifth of it).
	timeout := DefaultRelayConfig().RelayTimeout
	var oldest time.Duration
	for end := time.Now().Add(timeout * 3 / 2); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		var age time.Duration
		require.NoError(t, pool.QueryRow(ctx, `SELECT now() - heartbeat_at FROM outbox_relays WHERE id = $1`, r.id).Scan(&age))
		oldest = max(oldest, age)
	}
	require.Less(t, oldest, timeout/2, "the heartbeat kept its pace beside the blocked retry")
}

// startRelay starts a relay at the defaults, with webhooks to loopback
// allowed, after before (if not nil) had a look at it; it stops when the
// test ends.
func startRelay(t *testing.T, pool *pgxpool.Pool, before func(*Relay)) *Relay {
	t.Helper()
	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	if before != nil {
		before(r)
	}
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = r.Stop(stop)
	})
	return r
}
