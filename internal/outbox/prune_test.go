package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
)

// The prune job (River's leader runs it when the relay starts, then every
// prune interval) deletes delivered and discarded rows past the retention,
// in batches, and nothing else.
func TestPruneJobDeletesOnlyOldSettledRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	// 12,000 old delivered rows (more than one prune batch), old discarded
	// rows, and one row of every other kind, all equally old.
	_, err := f.pool.Exec(ctx, `
		INSERT INTO outbox_messages (type, destination, payload, status, delivered_at, created_at)
		SELECT 'order.placed', e.id, '{}', 'delivered', now() - interval '8 days', now() - interval '9 days'
		FROM webhook_endpoints e, generate_series(1, 12000);
		INSERT INTO outbox_messages (type, destination, payload, status, discarded_at, created_at)
		SELECT 'order.placed', e.id, '{}', 'discarded', now() - interval '8 days', now() - interval '9 days'
		FROM webhook_endpoints e, generate_series(1, 10);
		INSERT INTO outbox_messages (type, destination, payload, status, delivered_at, created_at)
		SELECT 'order.placed', e.id, '{"keep":"recent"}', 'delivered', now() - interval '1 hour', now() - interval '9 days'
		FROM webhook_endpoints e;
		INSERT INTO outbox_messages (type, destination, payload, status, discarded_at, created_at)
		SELECT 'order.placed', e.id, '{"keep":"recently discarded"}', 'discarded', now() - interval '1 hour', now() - interval '9 days'
		FROM webhook_endpoints e;
		INSERT INTO outbox_messages (type, destination, payload, status, last_error, created_at)
		SELECT 'order.placed', e.id, '{"keep":"failed"}', 'failed', 'x', now() - interval '9 days' FROM webhook_endpoints e;
		INSERT INTO outbox_messages (type, destination, payload, status, created_at)
		SELECT 'order.placed', e.id, '{"keep":"pending"}', 'pending', now() - interval '9 days' FROM webhook_endpoints e;
		INSERT INTO outbox_messages (type, destination, payload, status, claim_token, claimed_at, created_at)
		SELECT 'order.placed', e.id, '{"keep":"claimed"}', 'claimed', gen_random_uuid(), now(), now() - interval '9 days'
		FROM webhook_endpoints e;`)
	require.NoError(t, err)

	metrics := outbox.NewMetrics()
	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg))
	relay, err := outbox.NewRelay(f.pool, fastConfig(), &outbox.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		discardLogger(), metrics)
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = relay.Stop(c)
	})
	require.Eventually(t, func() bool { return counter(t, reg, "outbox_pruned_total") == 12010 },
		20*time.Second, 20*time.Millisecond, "the prune job deleted the old settled rows")

	rows, err := f.pool.Query(ctx, "SELECT payload->>'keep' FROM outbox_messages ORDER BY 1")
	require.NoError(t, err)
	var kept []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		kept = append(kept, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"claimed", "failed", "pending", "recent", "recently discarded"}, kept)
}
