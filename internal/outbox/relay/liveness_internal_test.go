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

// A reaping that PostgreSQL picked as a deadlock's victim after it had
// released the dead relay's claims runs again (inTx), and counts what it
// released once: the count was kept across the tries and doubled.
func TestAReapingRunAgainCountsItsReleasesOnce(t *testing.T) {
	t.Parallel()
	pool, ep, ids := seededEndpoint(t, 3, "")
	ctx := context.Background()
	dead := uuid.New()
	_, err := pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid, heartbeat_at) VALUES ($1, 'gone', 1, now() - interval '1 hour')`, dead)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', attempts = 1, claim_token = gen_random_uuid(),
		claimed_at = now(), claimed_by = $1 WHERE id = ANY ($2)`, dead, ids)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE webhook_endpoints SET lease_token = gen_random_uuid(), lease_relay = $1 WHERE id = $2`, dead, ep)
	require.NoError(t, err)
	// The lease's release, after the claims', fails once as a deadlock's
	// victim does (a sequence, which a rollback does not undo, says once).
	_, err = pool.Exec(ctx, `
		CREATE SEQUENCE deadlock_once;
		CREATE FUNCTION deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('deadlock_once') = 1 THEN
				RAISE EXCEPTION 'deadlock detected (injected)' USING ERRCODE = '40P01';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER deadlock_once BEFORE UPDATE ON webhook_endpoints
			FOR EACH ROW WHEN (OLD.lease_token IS NOT NULL AND NEW.lease_token IS NULL)
			EXECUTE FUNCTION deadlock_once();`)
	require.NoError(t, err)

	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, r.reapDead(ctx, conn.Conn()))

	var tries int
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_value FROM deadlock_once`).Scan(&tries))
	require.Equal(t, 2, tries, "the first try was the victim, the second went through")
	var pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status = 'pending'`).Scan(&pending))
	require.Equal(t, 3, pending, "the dead relay's claims are released")
	require.Equal(t, 3.0, testutil.ToFloat64(r.metrics.released.WithLabelValues("relay_dead")), "three claims released, counted once")
}
