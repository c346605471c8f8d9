package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// The prune job (River's leader runs it when the relay starts, then every
// prune interval) deletes delivered and discarded rows past the retention,
// in batches, then the old events no message refers to any more, and
// nothing else.
func TestPruneJobDeletesOnlyOldSettledRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	outboxtest.PartitionsSince(t, f.pool, time.Now().Add(-10*24*time.Hour))
	// Events of nine days ago, each with its message: 12,000 delivered
	// (more than one prune batch) and 10 discarded long ago, and one of
	// every other kind. Plus two events without messages, one old, one new.
	_, err := f.pool.Exec(ctx, `
		CREATE TEMP TABLE seed (keep text, status text, settled_at timestamptz, n integer);
		INSERT INTO seed VALUES
			(NULL, 'delivered', now() - interval '8 days', 12000),
			(NULL, 'discarded', now() - interval '8 days', 10),
			('recent', 'delivered', now() - interval '1 hour', 1),
			('recently discarded', 'discarded', now() - interval '1 hour', 1),
			('failed', 'failed', NULL, 1),
			('pending', 'pending', NULL, 1),
			('claimed', 'claimed', NULL, 1);
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7_at(now() - interval '9 days' + g * interval '1 microsecond'), 'order.placed',
			       json_build_object('keep', s.keep, 'status', s.status), now() - interval '9 days'
			FROM seed s, generate_series(1, s.n) g
			RETURNING id, payload->>'status' AS status, payload->>'keep' AS keep, created_at)
		INSERT INTO outbox_messages (id, event_id, type, destination, status, delivered_at, discarded_at,
		                             failed_at, claim_token, claimed_at, created_at, next_attempt_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', e.id, ev.status,
		       CASE WHEN ev.status = 'delivered' THEN s.settled_at END,
		       CASE WHEN ev.status = 'discarded' THEN s.settled_at END,
		       CASE WHEN ev.status = 'failed' THEN now() END,
		       CASE WHEN ev.status = 'claimed' THEN gen_random_uuid() END,
		       CASE WHEN ev.status = 'claimed' THEN now() END,
		       ev.created_at, ev.created_at
		FROM ev JOIN seed s ON s.status = ev.status AND s.keep IS NOT DISTINCT FROM ev.keep, webhook_endpoints e;
		INSERT INTO outbox_events (id, type, payload, created_at) VALUES
			(outbox_uuid_v7_at(now() - interval '9 days'), 'unheard', '{"keep":"old unheard"}', now() - interval '9 days'),
			(outbox_uuid_v7(), 'unheard', '{"keep":"recent unheard"}', now());`)
	require.NoError(t, err)

	metrics := relay.NewMetrics()
	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg))
	rl, err := relay.New(f.pool, fastConfig(), &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		discardLogger(), metrics)
	require.NoError(t, err)
	require.NoError(t, rl.Start(ctx))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = rl.Stop(c)
	})
	within(t, 20*time.Second, func() bool { return counter(t, reg, "outbox_pruned_total") == 12010 }, "the prune job deleted the old settled rows")

	kept := func(query string) []string {
		rows, err := f.pool.Query(ctx, query)
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	require.Equal(t, []string{"claimed", "failed", "pending", "recent", "recently discarded"},
		kept("SELECT COALESCE(ev.payload->>'keep', '') FROM outbox_messages m JOIN outbox_events ev ON ev.id = m.event_id ORDER BY 1"))
	within(t, 10*time.Second, func() bool {
		return len(kept("SELECT COALESCE(payload->>'keep', '') FROM outbox_events ORDER BY 1")) == 6
	}, "the old events without messages are pruned after the messages")
	require.Equal(t, []string{"claimed", "failed", "pending", "recent", "recent unheard", "recently discarded"},
		kept("SELECT COALESCE(payload->>'keep', '') FROM outbox_events ORDER BY 1"),
		"an event stays while a message refers to it, and for the retention")
}
