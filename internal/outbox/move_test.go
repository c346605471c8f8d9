package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// A PATCH that moves an endpoint to another destination resets its
// health: the old destination's open circuit, failure streak and backoff
// say nothing of the new one, which is tried at once, a message whose own
// retry is later included, instead of at the old one's next probe. A
// change that keeps the destination keeps the health.
func TestMovingAnEndpointResetsItsHealth(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	oldRC, newRC := newReceiver(t), newReceiver(t)
	ep := f.endpoint(t, oldRC, "order.placed")
	newRC.setSecret(ep.Secret)
	id := f.enqueue(t, "order.placed", 1)[0]
	// The old destination's outage: the message tried twice, its retry 10
	// minutes off, and the endpoint backing off as a whole for an hour.
	backOff := func() {
		t.Helper()
		_, err := f.pool.Exec(ctx, `UPDATE outbox_messages SET attempts = 2, last_error = '502 Bad Gateway',
			next_attempt_at = now() + interval '10 minutes' WHERE id = $1`, id)
		require.NoError(t, err)
		_, err = f.pool.Exec(ctx, `UPDATE webhook_endpoints SET health = 'backing_off', health_reason = '502 Bad Gateway',
			health_changed_at = now() - interval '1 minute', consecutive_failures = 6, backoff_until = now() + interval '1 hour'
			WHERE id = $1`, ep.ID)
		require.NoError(t, err)
	}
	backOff()

	// Changes that keep the destination keep its health.
	for name, c := range map[string]admin.EndpointChange{
		"event types": {EventTypes: []string{"order.placed", "order.cancelled"}},
		"same url":    {URL: &ep.URL},
	} {
		kept, err := f.admin.UpdateEndpoint(ctx, ep.ID, c)
		require.NoError(t, err, name)
		require.Equal(t, outbox.HealthBackingOff, kept.State, "%s: the destination is the same, and so is its health", name)
		require.Equal(t, 6, kept.ConsecutiveFailures, name)
	}

	url := newRC.srv.URL + "/hook"
	moved, err := f.admin.UpdateEndpoint(ctx, ep.ID, admin.EndpointChange{URL: &url})
	require.NoError(t, err)
	require.Equal(t, outbox.HealthHealthy, moved.State, "a new destination starts healthy")
	require.Zero(t, moved.ConsecutiveFailures, "the old destination's failures are not the new one's")
	require.Nil(t, moved.NextProbeAt)
	require.Nil(t, moved.ThrottledUntil)
	require.Empty(t, moved.StateReason)

	f.startRelay(t, relay.Config{}, nil)
	within(t, 10*time.Second, func() bool { return f.status(t, id) == outbox.StatusDelivered },
		"the new destination is tried at once, not at the old one's probe an hour away or the message's retry 10 minutes away")
	require.Equal(t, 1, newRC.total())
	require.Zero(t, oldRC.total())
}

// A move to another destination takes effect for a key once the key's
// message in flight has settled: that one finishes at the old destination,
// and the key's next message, which waited for it, goes to the new one.
// The new destination never gets a key's later event while an earlier one
// is still on its way to the old. (Events the old destination got before
// the move are the new one's to ask for: a replay of the range.)
func TestAMoveTakesEffectForAKeyAfterItsMessageInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	oldRC, newRC := newReceiver(t), newReceiver(t)
	ep := f.endpoint(t, oldRC, "order.placed")
	newRC.setSecret(ep.Secret)
	first := f.deliveries(t, f.publish(t, outbox.Event{Type: "order.placed", Data: 1, OrderingKey: "o"}))[0]
	second := f.deliveries(t, f.publish(t, outbox.Event{Type: "order.placed", Data: 2, OrderingKey: "o"}))[0]
	hold := &holdingTransport{
		Transport: &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, 2), release: make(chan struct{}),
	}
	f.startRelay(t, fastConfig(), hold)
	require.Equal(t, first, <-hold.sent, "the key's first message is in flight to the old destination")

	moved := newRC.srv.URL + "/hook"
	_, err := f.admin.UpdateEndpoint(ctx, ep.ID, admin.EndpointChange{URL: &moved})
	require.NoError(t, err)
	never(t, 300*time.Millisecond, func() bool { return newRC.total() > 0 },
		"the key's next message waits for the one in flight")
	close(hold.release)
	eventually(t, func() bool { return f.status(t, second) == outbox.StatusDelivered }, "then goes")
	require.Equal(t, 1, oldRC.count(f.event(t, first)), "the one in flight finished at the old destination")
	require.Equal(t, 1, newRC.count(f.event(t, second)), "the next went to the new one")
	require.Zero(t, newRC.count(f.event(t, first)))
}
