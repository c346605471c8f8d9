package relay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A worker whose clock is off writes the times that others compare with
// the database's now() on the database's clock: a destination refusing
// connections backs off for the probe delay from now, not an hour more
// (worker ahead) or already over (worker behind, so the breaker would not
// hold it); its attempts are stamped with the database's time; and the
// relay's last claim is not in the future. The worker's clock is the one
// thing changed here (r.now), at the defaults otherwise.
func TestRelayWritesTimesOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	for name, skew := range map[string]time.Duration{"worker an hour ahead": time.Hour, "worker an hour behind": -time.Hour} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.Pool(t)
			ctx := context.Background()
			ep := outboxtest.Endpoint(t, pool, nil) // 127.0.0.1:1 refuses connections
			outboxtest.Seed(t, pool, ep, 10, "")
			r := startRelay(t, pool, func(r *Relay) { r.now = func() time.Time { return time.Now().Add(skew) } })

			var left time.Duration
			require.Eventually(t, func() bool {
				err := pool.QueryRow(ctx, `SELECT backoff_until - now() FROM webhook_endpoints
					WHERE id = $1 AND health = 'backing_off'`, ep).Scan(&left)
				return err == nil
			}, 20*time.Second, 20*time.Millisecond, "the refusing destination backs off")
			first := r.cfg.probeDelay(0)
			require.Greater(t, left, time.Duration(0), "the backoff is not over before it starts")
			require.Less(t, left, first*2, "the backoff lasts the probe delay (%s), not the worker's skew more", first)

			var offset time.Duration
			require.NoError(t, pool.QueryRow(ctx, `SELECT make_interval(secs => max(abs(extract(epoch FROM a.finished_at - now())))::float8)
				FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id WHERE m.destination = $1`, ep).Scan(&offset))
			require.Less(t, offset, time.Minute, "attempts stamped with the database's time")
			require.Eventually(t, func() bool {
				var ahead *time.Duration
				require.NoError(t, pool.QueryRow(ctx, `SELECT last_claim_at - now() FROM outbox_relays WHERE id = $1`, r.id).Scan(&ahead))
				return ahead != nil && *ahead <= time.Second
			}, 10*time.Second, 50*time.Millisecond, "the last claim, written by the heartbeat, is not in the future")
		})
	}
}
