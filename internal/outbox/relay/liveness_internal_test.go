package relay

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
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
	timeout := DefaultConfig().RelayTimeout
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

// One lock held on one endpoint's row (an operator's open transaction, a
// worker frozen mid-statement) holds up the release of that destination's
// lost claims only: every other destination's are released in the same
// pass, and the held one's at the first pass after the lock is let go.
// Before, the release of every dead relay's claims and leases was one
// transaction, which waited for that lock, and no destination's claims
// were released meanwhile.
func TestALockedEndpointHoldsUpOnlyItsOwnRecovery(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	locked, free := outboxtest.Endpoint(t, pool, nil), outboxtest.Endpoint(t, pool, nil)
	dead := uuid.New() // a relay with no row: not alive
	for _, ep := range []uuid.UUID{locked, free} {
		ids := outboxtest.Seed(t, pool, ep, 2, "")
		_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = gen_random_uuid(),
			claimed_at = now(), claimed_by = $1 WHERE id = ANY ($2)`, dead, ids)
		require.NoError(t, err)
	}
	op, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer op.Rollback(ctx) //nolint:errcheck
	_, err = op.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)

	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	claimed := func(ep uuid.UUID) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'claimed'`, ep).Scan(&n))
		return n
	}
	start := time.Now()
	err = r.recover(ctx)
	require.ErrorContains(t, err, locked.String(), "the locked destination's release waited its bound and failed")
	require.Less(t, time.Since(start), 3*recoveryLockWait, "one lock wait, bounded")
	require.Zero(t, claimed(free), "the other destination's claims are released in the same pass")
	require.Equal(t, 2, claimed(locked), "the locked one's wait")
	require.Equal(t, 2.0, testutil.ToFloat64(r.metrics.released.WithLabelValues("relay_dead")), "and only what was released is counted")

	require.NoError(t, op.Rollback(ctx))
	require.NoError(t, r.recover(ctx))
	require.Zero(t, claimed(locked), "released at the first pass after the lock is let go")
}
