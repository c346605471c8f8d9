package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

func TestPruneDeletesOnlyOldDeliveredRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	// 12,000 old delivered rows (more than one prune batch), and one row of
	// every other kind, all equally old.
	_, err := f.pool.Exec(ctx, `
		INSERT INTO outbox_messages (type, destination, payload, status, delivered_at, created_at)
		SELECT 'order.placed', e.id, '{}', 'delivered', now() - interval '8 days', now() - interval '9 days'
		FROM webhook_endpoints e, generate_series(1, 12000);
		INSERT INTO outbox_messages (type, destination, payload, status, delivered_at, created_at)
		SELECT 'order.placed', e.id, '{"keep":"recent"}', 'delivered', now() - interval '1 hour', now() - interval '9 days'
		FROM webhook_endpoints e;
		INSERT INTO outbox_messages (type, destination, payload, status, last_error, created_at)
		SELECT 'order.placed', e.id, '{"keep":"failed"}', 'failed', 'x', now() - interval '9 days' FROM webhook_endpoints e;
		INSERT INTO outbox_messages (type, destination, payload, status, created_at)
		SELECT 'order.placed', e.id, '{"keep":"pending"}', 'pending', now() - interval '9 days' FROM webhook_endpoints e;
		INSERT INTO outbox_messages (type, destination, payload, status, claim_token, claimed_at, created_at)
		SELECT 'order.placed', e.id, '{"keep":"claimed"}', 'claimed', gen_random_uuid(), now(), now() - interval '9 days'
		FROM webhook_endpoints e;`)
	require.NoError(t, err)

	relay, err := outbox.NewRelay(f.pool, fastConfig(), nil, discardLogger(), nil)
	require.NoError(t, err)
	n, err := relay.Prune(ctx, time.Now().Add(-7*24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(12000), n)

	rows, err := f.pool.Query(ctx, "SELECT payload->>'keep' FROM outbox_messages ORDER BY 1")
	require.NoError(t, err)
	var kept []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		kept = append(kept, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"claimed", "failed", "pending", "recent"}, kept)
}
