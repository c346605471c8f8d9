package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// "Running but making no progress" must be distinguishable from "idle" and
// from "a destination is down".
func TestCheckStalledTellsStallFromIdleAndBackoff(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	const threshold = 100 * time.Millisecond

	// A relay that is not running at all: nothing claims.
	stuck, err := relay.New(f.pool, fastConfig(), nil, discardLogger(), nil)
	require.NoError(t, err)

	backingOff := f.enqueue(t, "order.placed", "backing off")[0]
	_, err = f.pool.Exec(ctx, "UPDATE outbox_messages SET next_attempt_at = now() + interval '1 hour', attempts = 3 WHERE id = $1", backingOff)
	require.NoError(t, err)
	// Idle time is measured on the relay's clock from its creation; there
	// is no event to wait for, only time to pass.
	time.Sleep(2 * threshold)
	require.NoError(t, stuck.CheckStalled(ctx, threshold), "messages backing off are not a stall")

	due := f.enqueue(t, "order.placed", "due")[0]
	_, err = f.pool.Exec(ctx, "UPDATE outbox_messages SET next_attempt_at = now() - interval '1 minute', created_at = now() - interval '1 minute' WHERE id = $1", due)
	require.NoError(t, err)
	require.ErrorIs(t, stuck.CheckStalled(ctx, threshold), relay.ErrStalled, "a due message waits and nothing claims")
	require.NoError(t, stuck.CheckStalled(ctx, 5*time.Minute), "within the threshold it is not yet a stall")

	// A running relay claims it and is not stalled.
	running := f.startRelay(t, fastConfig(), nil)
	eventually(t, func() bool { return f.status(t, due) == outbox.StatusDelivered }, "delivered")
	require.NoError(t, running.CheckStalled(ctx, threshold))
}
