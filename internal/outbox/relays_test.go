package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// RelayStatus answers "is anyone delivering?" from what PostgreSQL sees:
// down with no live relay (even when a killed one's row is still there),
// running while a relay at its defaults claims, with River's leader named,
// and down again once it stops.
func TestRelayStatusFollowsTheRelays(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")

	s, err := f.admin.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.RelayDown, s.State, "no relay has ever run")
	require.Zero(t, s.Alive)
	require.Nil(t, s.Leader)

	// A worker that was SIGKILLed a minute ago and that nobody reaped: its
	// row is there, silent; it must not count as alive.
	killed := uuid.New()
	_, err = f.pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid, heartbeat_at, started_at)
		VALUES ($1, 'killed-host', 4242, now() - interval '1 minute', now() - interval '1 hour')`, killed)
	require.NoError(t, err)
	due := f.enqueue(t, "order.placed", "while nobody runs")[0]
	s, err = f.admin.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.RelayDown, s.State)
	require.Contains(t, s.Reason, "The last heartbeat of any worker was 1m")
	require.Len(t, s.Relays, 1)
	require.False(t, s.Relays[0].Alive)
	require.Equal(t, int64(1), s.Due, "the message is due and waits for a relay")

	// A relay at its defaults: alive at once, claims the due message, and
	// River elects it leader.
	rl := f.startRelay(t, relay.Config{}, nil)
	eventually(t, func() bool { return f.status(t, due) == outbox.StatusDelivered }, "delivered")
	var live admin.RelayProcess
	require.Eventually(t, func() bool {
		s, err = f.admin.Relays(ctx)
		require.NoError(t, err)
		for _, r := range s.Relays {
			if r.Alive {
				live = r
			}
		}
		return live.LastClaimAt != nil && s.Leader != nil
	}, 30*time.Second, 50*time.Millisecond, "the live relay's claim and River's leader never showed")
	require.Equal(t, admin.RelayRunning, s.State)
	require.Equal(t, 1, s.Alive, "the killed relay is reaped or silent; the new one is alive")
	require.Equal(t, live.ID.String(), s.Leader.ID, "River's leader is the relay: its client id is the relay's")
	require.True(t, live.Leader)
	require.Zero(t, s.Due)
	require.WithinDuration(t, time.Now(), *s.LastClaimAt, 30*time.Second)

	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, rl.Stop(stopCtx))
	s, err = f.admin.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.RelayDown, s.State, "a stopped relay unregisters")
}

// A relay that heartbeats but claims nothing while a message is due past the
// stall threshold is stalled; the same backlog within the threshold, or
// waiting out a retry, is not.
func TestRelayStatusTellsStalledFromBackingOff(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	// The threshold is the knob under test.
	adm := admin.New(f.pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		admin.WithStallThreshold(30*time.Second))

	// A live relay row (heartbeating now) that has not claimed for an hour:
	// a wedged worker, as PostgreSQL sees it.
	_, err := f.pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid, last_claim_at)
		VALUES ($1, 'wedged', 7, now() - interval '1 hour')`, uuid.New())
	require.NoError(t, err)

	retrying := f.enqueue(t, "order.placed", "retrying")[0]
	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET attempts = 2, next_attempt_at = now() + interval '5 minutes',
		created_at = now() - interval '1 hour' WHERE id = $1`, retrying)
	require.NoError(t, err)
	s, err := adm.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.RelayRunning, s.State, "an old message waiting for its retry is not a stall")
	require.Equal(t, int64(1), s.Scheduled)
	require.Zero(t, s.Due)

	due := f.enqueue(t, "order.placed", "due")[0]
	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET next_attempt_at = now() - interval '10 seconds',
		created_at = now() - interval '1 hour' WHERE id = $1`, due)
	require.NoError(t, err)
	s, err = adm.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.RelayRunning, s.State, "due for 10 s, within the threshold")
	require.Equal(t, int64(1), s.Due)

	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET next_attempt_at = now() - interval '2 minutes' WHERE id = $1`, due)
	require.NoError(t, err)
	s, err = adm.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.RelayStalled, s.State, "due for 2 minutes and nobody claimed for an hour")
	require.Contains(t, s.Reason, "due for 2m")
	require.InDelta(t, 120, s.OldestDueSeconds, 10)
}

// A relay is declared dead by the timeout it registered with, not by the
// declarer's: during a rolling change of OUTBOX_RELAY_TIMEOUT, a relay with
// a short timeout must not reap one with a long timeout (which beats less
// often) while it lives and sends.
func TestRelaysAreJudgedByTheirOwnTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	// Both last beat 3 s ago: alive by a 10 s timeout, dead by a 1 s one.
	slow, dead := uuid.New(), uuid.New()
	_, err := f.pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid, heartbeat_at, timeout_seconds)
		VALUES ($1, 'slow-host', 1, now() - interval '3 seconds', 10), ($2, 'dead-host', 2, now() - interval '3 seconds', 1)`, slow, dead)
	require.NoError(t, err)

	cfg := relay.Config{RelayTimeout: time.Second}
	f.startRelay(t, cfg, nil)
	exists := func(id uuid.UUID) bool {
		var n int
		require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_relays WHERE id = $1", id).Scan(&n))
		return n == 1
	}
	eventually(t, func() bool { return !exists(dead) }, "the relay silent past its own 1 s timeout is declared dead")
	require.True(t, exists(slow), "the relay within its own 10 s timeout is alive, whatever the declarer's timeout")
}

// Nothing due means nothing overdue. An endpoint whose Retry-After or probe
// ended ten minutes ago, with its one message waiting out a retry, has no
// due message: its oldest due age is zero, not the ten minutes since the
// backoff ended (GREATEST skips a NULL, so the age once grew from the ended
// backoff alone and the relay read as stalled, with
// outbox_oldest_due_overdue_seconds alerting, during an ordinary outage).
// Once a message is due, it is due from the later of its own time and the
// end of the backoff.
func TestOldestDueIgnoresAnEndedBackoffWithNothingDue(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	adm := admin.New(f.pool, netguard.Guard{AllowPrivate: true}, discardLogger(),
		admin.WithStallThreshold(30*time.Second))
	// A live relay that has not claimed for an hour: were anything due past
	// the threshold, it would be stalled.
	_, err := f.pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid, last_claim_at)
		VALUES ($1, 'idle', 7, now() - interval '1 hour')`, uuid.New())
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE webhook_endpoints SET backoff_until = now() - interval '10 minutes' WHERE id = $1`, ep.ID)
	require.NoError(t, err)
	retrying := f.enqueue(t, "order.placed", "retrying")[0]
	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET attempts = 3, next_attempt_at = now() + interval '5 minutes',
		created_at = now() - interval '1 hour' WHERE id = $1`, retrying)
	require.NoError(t, err)

	s, err := adm.Relays(ctx)
	require.NoError(t, err)
	require.Zero(t, s.Due)
	require.Zero(t, s.OldestDueSeconds, "nothing is due, so nothing is overdue")
	require.Equal(t, admin.RelayRunning, s.State, "a retry waited out is not a stall")

	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET next_attempt_at = now() - interval '20 minutes' WHERE id = $1`, retrying)
	require.NoError(t, err)
	s, err = adm.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), s.Due)
	require.InDelta(t, 600, s.OldestDueSeconds, 10, "due since the backoff ended, not since its own earlier time")
}
