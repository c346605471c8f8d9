package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// An order's events written on three days sit in three partitions of the
// outbox tables, and nothing the outbox promises notices: they reach the
// receiver in their key's order, a replay of the three days re-sends them
// in that order under their ids, and the admin API lists them by key and
// shows each one's attempts, across the partitions' bounds.
func TestAKeysEventsInThreePartitionsKeepEveryPromise(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	outboxtest.PartitionsSince(t, f.pool, time.Now().Add(-3*24*time.Hour))
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")

	// Two events of the order written two days and one day ago, each with
	// its pending delivery, as Enqueue writes them on those days; the third
	// written now.
	var events []uuid.UUID
	for _, daysAgo := range []int{2, 1} {
		var id uuid.UUID
		require.NoError(t, f.pool.QueryRow(ctx, `WITH ev AS (
				INSERT INTO outbox_events (id, type, payload, ordering_key, created_at)
				SELECT outbox_uuid_sibling(outbox_uuid_at(at)), 'order.placed', json_build_object('days_ago', $2::int), 'order-1', at
				FROM (SELECT now() - make_interval(days => $2) AS at) t RETURNING id, created_at)
			INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, next_attempt_at, created_at)
			SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', $1, 'order-1', ev.created_at, ev.created_at FROM ev
			RETURNING event_id`, ep.ID, daysAgo).Scan(&id))
		events = append(events, id)
	}
	events = append(events, f.publish(t, outbox.Event{Type: "order.placed", Data: 0, OrderingKey: "order-1"}))
	var partitions int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM outbox_messages`).Scan(&partitions))
	require.Equal(t, 3, partitions, "one delivery in each of three partitions")

	f.startRelay(t, relay.Config{}, nil)
	var want []string
	for _, id := range events {
		want = append(want, id.String())
	}
	eventually(t, func() bool { return len(rc.arrivals()) == 3 }, "the three events arrive")
	require.Equal(t, want, rc.arrivals(), "in their key's order, across the partitions")

	replayTo := newReceiver(t)
	ep2 := f.endpoint(t, replayTo, "order.placed")
	res, err := f.admin.ReplayEvents(ctx, ep2.ID, admin.Replay{From: time.Now().Add(-3 * 24 * time.Hour), To: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 3, res.Replayed)
	eventually(t, func() bool { return len(replayTo.arrivals()) == 3 }, "the replay of three days arrives")
	require.Equal(t, want, replayTo.arrivals(), "replayed in the key's order, under the events' ids")

	eventually(t, func() bool {
		msgs, _, err := f.admin.Messages(ctx, admin.MessageFilter{OrderingKey: "order-1", Status: outbox.StatusDelivered})
		require.NoError(t, err)
		return len(msgs) == 6
	}, "the key's six deliveries, listed across the partitions")
	msgs, _, err := f.admin.Messages(ctx, admin.MessageFilter{OrderingKey: "order-1"})
	require.NoError(t, err)
	for _, m := range msgs {
		d := f.message(t, m.ID)
		require.Len(t, d.History, 1, "each delivery's attempt, in its partition of the attempts")
		require.Equal(t, "delivered", d.History[0].Outcome)
	}
}
